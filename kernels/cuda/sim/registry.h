// The sim's table of kernels by name: each kernels/cuda/*.cu is compiled as its own translation
// unit followed by `TPSLAB_SIM_KERNEL(name)` lines (one per `.entry` of its committed PTX), each
// of which adds a thunk that converts the job's arguments to the kernel's parameter types.
#pragma once
#include "sim.h"

#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

namespace sim {
struct Arg {
    char kind; // 'p' pointer, 'i' int, 'l' long long, 'f' float
    void* p;
    long long v;
    float f;
};
using Thunk = std::function<void(const std::vector<Arg>&)>;

inline std::map<std::string, Thunk>& registry() {
    static std::map<std::string, Thunk> r;
    return r;
}

template <class T>
T convert(const Arg& a) {
    if constexpr (std::is_pointer_v<T>) {
        if (a.kind != 'p') throw std::invalid_argument("expected a pointer");
        return reinterpret_cast<T>(a.p);
    } else if constexpr (std::is_same_v<T, float>) {
        if (a.kind != 'f') throw std::invalid_argument("expected a float");
        return a.f;
    } else if constexpr (std::is_same_v<T, long long>) {
        if (a.kind != 'l') throw std::invalid_argument("expected a long long");
        return a.v;
    } else {
        static_assert(std::is_same_v<T, int>);
        if (a.kind != 'i') throw std::invalid_argument("expected an int");
        return (int)a.v;
    }
}

template <class... A, std::size_t... I>
void call(void (*f)(A...), const std::vector<Arg>& a, std::index_sequence<I...>) {
    f(convert<A>(a[I])...);
}

template <class... A>
bool add(const char* name, void (*f)(A...)) {
    registry()[name] = [f, name](const std::vector<Arg>& a) {
        if (a.size() != sizeof...(A))
            throw std::invalid_argument(std::string(name) + ": wrong argument count");
        call(f, a, std::index_sequence_for<A...>{});
    };
    return true;
}
} // namespace sim

#define TPSLAB_SIM_CAT2(a, b) a##b
#define TPSLAB_SIM_CAT(a, b) TPSLAB_SIM_CAT2(a, b)
#define TPSLAB_SIM_KERNEL(name) \
    static const bool TPSLAB_SIM_CAT(reg_, name) = sim::add(#name, &name);
