#!/usr/bin/env python3
"""Embedding throughput of `tpslab serve` against `llama-server --embeddings` on one model, in
one run: N inputs of about WORDS words each, sent as requests of BATCH inputs with CONC requests
in flight (OpenAI's /v1/embeddings on both), ROUNDS rounds interleaved. Prints inputs/s and
prompt tokens/s per server and round, the median ratio, and the cosine between the two servers'
vectors for the first inputs (same pooling on both).

  python3 tests/bench/embeddings-vs-llamacpp.py [MODEL]
Knobs (environment): TPS (target/release/tpslab), LLAMA_BIN (/tmp/llama-cpp-ref/llama.cpp/build/bin),
POOLING (mean), N (256), WORDS (48), BATCH (32), CONC (2), ROUNDS (3), THREADS (2).
"""
import concurrent.futures, json, math, os, random, socket, statistics, subprocess, sys, time
import urllib.request

MODEL = sys.argv[1] if len(sys.argv) > 1 else os.path.expanduser(
    "~/.local/share/tpslab/models/SmolLM2-135M-Instruct.Q4_1.gguf")
TPS = os.environ.get("TPS", "target/release/tpslab")
BIN = os.environ.get("LLAMA_BIN", "/tmp/llama-cpp-ref/llama.cpp/build/bin")
POOLING = os.environ.get("POOLING", "mean")
N, WORDS = int(os.environ.get("N", 256)), int(os.environ.get("WORDS", 48))
BATCH, CONC = int(os.environ.get("BATCH", 32)), int(os.environ.get("CONC", 2))
ROUNDS, THREADS = int(os.environ.get("ROUNDS", 3)), os.environ.get("THREADS", "2")

rng = random.Random(7)
VOCAB = ("the of and to in is was for on that with as by at from this be are it an which or "
         "engine batch token model cache memory prompt answer speed vector search index text "
         "river mountain city garden music paper window light water stone").split()
INPUTS = [" ".join(rng.choice(VOCAB) for _ in range(WORDS)) for _ in range(N)]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/embeddings", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


def start(cmd, port):
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         env=dict(os.environ, LD_LIBRARY_PATH=BIN))
    for _ in range(600):
        try:
            post(port, {"input": "warm up"})
            return p
        except Exception:
            time.sleep(0.2)
    p.kill()
    sys.exit(f"{cmd[0]} did not start")


def run(port):
    batches = [INPUTS[i:i + BATCH] for i in range(0, N, BATCH)]
    t = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(CONC) as ex:
        outs = list(ex.map(lambda b: post(port, {"input": b, "encoding_format": "float"}), batches))
    dt = time.perf_counter() - t
    tokens = sum(o["usage"]["prompt_tokens"] for o in outs)
    vectors = [d["embedding"] for o in outs for d in sorted(o["data"], key=lambda d: d["index"])]
    return N / dt, tokens / dt, vectors


def cos(a, b):
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


servers = {
    "tpslab": lambda port: [TPS, "serve", "--model", MODEL, "--port", str(port), "--device", "cpu",
                            "--threads", THREADS, "--pooling", POOLING],
    "llama.cpp": lambda port: [f"{BIN}/llama-server", "-m", MODEL, "--port", str(port), "-t", THREADS,
                               "-c", str(4096 * CONC), "-np", str(CONC), "-b", "4096", "-ub", "4096",
                               "--no-webui", "--embeddings", "--pooling", POOLING],
}
print(f"# model {MODEL}; pooling {POOLING}; {N} inputs of {WORDS} words; requests of {BATCH}, "
      f"{CONC} in flight; threads {THREADS}; load {os.getloadavg()[0]:.2f}")
rates = {k: [] for k in servers}
last = {}
for r in range(ROUNDS):
    for name, cmd in servers.items():
        port = free_port()
        p = start(cmd(port), port)
        try:
            ips, tps, vecs = run(port)
        finally:
            p.terminate()
            p.wait()
        rates[name].append((ips, tps))
        last[name] = vecs
        print(f"round {r + 1} {name}: {ips:.1f} inputs/s, {tps:.0f} prompt tokens/s")
med = {k: statistics.median(i for i, _ in v) for k, v in rates.items()}
ratios = [a[0] / b[0] for a, b in zip(rates["tpslab"], rates["llama.cpp"])]
print(f"median inputs/s: tpslab {med['tpslab']:.1f}, llama.cpp {med['llama.cpp']:.1f}; "
      f"same-round ratio median {statistics.median(ratios):.2f}x "
      f"({min(ratios):.2f} .. {max(ratios):.2f})")
cs = [cos(a, b) for a, b in zip(last["tpslab"][:16], last["llama.cpp"][:16])]
print(f"cosine tpslab vs llama.cpp, first 16 inputs: {min(cs):.5f} .. {max(cs):.5f}")
