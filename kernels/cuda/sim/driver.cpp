// Runs kernels of kernels/cuda/*.cu on the CPU (sim.h) from a job file, for the Rust tests in
// kernels/tests/cuda_sim.rs (which write the job, build this with every .cu as its own
// translation unit plus a registry of its kernels, and compare what it dumps):
//
//   buf ID BYTES PATH        load PATH (or zeros when PATH is -) into buffer ID, 256-byte aligned
//   fill ID BYTE             set every byte of buffer ID (0xff poisons an output with NaNs)
//   launch NAME GX GY BX ARG...
//                            ARG: pID+OFFSET (a pointer into buffer ID), n (a null pointer),
//                            iN (int), lN (long long), fHEX (a float's bits)
//   dump ID PATH             write buffer ID to PATH
//
// Each buffer is its own allocation of exactly BYTES, so AddressSanitizer reports a kernel that
// reads or writes past it.
#include "registry.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

namespace {
[[noreturn]] void fail(const std::string& why) {
    std::fprintf(stderr, "sim driver: %s\n", why.c_str());
    std::exit(2);
}
} // namespace

int main(int argc, char** argv) {
    if (argc != 2) fail("usage: driver JOB");
    std::ifstream job(argv[1]);
    if (!job) fail(std::string("cannot read ") + argv[1]);
    std::map<int, std::pair<unsigned char*, size_t>> bufs;
    std::string line;
    while (std::getline(job, line)) {
        std::istringstream in(line);
        std::string op;
        in >> op;
        if (op == "buf") {
            int id;
            size_t bytes;
            std::string path;
            in >> id >> bytes >> path;
            auto* p = static_cast<unsigned char*>(std::aligned_alloc(256, (bytes + 255) / 256 * 256));
            if (!p) fail("out of memory");
            std::memset(p, 0, bytes);
            if (path != "-") {
                std::ifstream f(path, std::ios::binary);
                if (!f.read(reinterpret_cast<char*>(p), (std::streamsize)bytes)) fail("short read: " + path);
            }
            bufs[id] = {p, bytes};
        } else if (op == "fill") {
            int id, byte;
            in >> id >> byte;
            std::memset(bufs.at(id).first, byte, bufs.at(id).second);
        } else if (op == "launch") {
            std::string name, a;
            unsigned gx, gy, bx;
            in >> name >> gx >> gy >> bx;
            std::vector<sim::Arg> args;
            while (in >> a) {
                sim::Arg arg{};
                arg.kind = a[0];
                if (a[0] == 'p') {
                    const auto plus = a.find('+');
                    const auto& b = bufs.at(std::stoi(a.substr(1, plus - 1)));
                    const size_t off = std::stoull(a.substr(plus + 1));
                    if (off > b.second) fail("pointer past its buffer: " + a);
                    arg.p = b.first + off;
                } else if (a[0] == 'n') {
                    arg.kind = 'p';
                    arg.p = nullptr;
                } else if (a[0] == 'i' || a[0] == 'l') {
                    arg.v = std::stoll(a.substr(1));
                } else if (a[0] == 'f') {
                    const uint32_t bits = (uint32_t)std::stoul(a.substr(1), nullptr, 16);
                    std::memcpy(&arg.f, &bits, 4);
                } else {
                    fail("bad argument " + a);
                }
                args.push_back(arg);
            }
            const auto& reg = sim::registry();
            const auto k = reg.find(name);
            if (k == reg.end()) fail("no kernel " + name);
            sim::launch(dim3{gx, gy, 1}, dim3{bx, 1, 1}, [&] { k->second(args); });
        } else if (op == "dump") {
            int id;
            std::string path;
            in >> id >> path;
            std::ofstream f(path, std::ios::binary);
            f.write(reinterpret_cast<const char*>(bufs.at(id).first), (std::streamsize)bufs.at(id).second);
            if (!f) fail("cannot write " + path);
        } else if (!op.empty()) {
            fail("bad job line: " + line);
        }
    }
    for (auto& [id, b] : bufs) std::free(b.first);
    return 0;
}
