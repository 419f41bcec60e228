"""Build the libFuzzer harness and fuzz the C core under ASan and UBSan.

    python fuzz/run.py [--seconds N] [--runs N] [--jobs N]     (make fuzz FUZZ_SECONDS=N)

Writes the seed corpus (fuzz/make_corpus.py) into build/fuzz/seeds, builds
build/fuzz/fuzz_core from fuzz/*.c and modules/microtrain/mt_*.c with clang
(-fsanitize=fuzzer,address,undefined, every UBSan finding fatal), runs it for N
seconds on build/fuzz/corpus (kept between runs) and prints executions, time,
coverage and findings. A finding is a file in build/fuzz/artifacts/; exit status
1 then. Reproduce one with `build/fuzz/fuzz_core FILE`; once fixed, copy it into
tests/fuzz_cases/ (see tests/core/test_fuzz_regressions.py).
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CORE = os.path.join(ROOT, "modules", "microtrain")
OUT = os.path.join(ROOT, "build", "fuzz")
SANITIZE = ["-fsanitize=fuzzer,address,undefined", "-fno-sanitize-recover=all"]


def build(clang):
    exe = os.path.join(OUT, "fuzz_core")
    sources = sorted(glob.glob(os.path.join(HERE, "*.c"))) + sorted(glob.glob(os.path.join(CORE, "mt_*.c")))
    cmd = [clang, "-std=c99", "-g", "-O1", "-fno-omit-frame-pointer", "-I", CORE] + SANITIZE + sources + ["-o", exe, "-lm"]
    subprocess.run(cmd, check=True)
    return exe


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=int, default=60, help="fuzzing time (default 60)")
    ap.add_argument("--runs", type=int, default=-1, help="stop after this many executions (default: no limit)")
    ap.add_argument("--clang", default=os.environ.get("CLANG", "clang"))
    ap.add_argument("--max-len", type=int, default=65536, help="largest plan the fuzzer makes (bytes)")
    args = ap.parse_args()
    if shutil.which(args.clang) is None:
        sys.exit("fuzz: %s not found; Debian: apt-get install clang libclang-rt-dev" % args.clang)
    seeds, corpus, artifacts = (os.path.join(OUT, d) for d in ("seeds", "corpus", "artifacts"))
    for d in (seeds, corpus, artifacts):
        os.makedirs(d, exist_ok=True)
    subprocess.run([sys.executable, os.path.join(HERE, "make_corpus.py"), seeds], check=True)
    exe = build(args.clang)
    before = set(os.listdir(artifacts))
    cmd = [exe, corpus, seeds, "-max_total_time=%d" % args.seconds, "-runs=%d" % args.runs,
           "-max_len=%d" % args.max_len, "-timeout=60", "-rss_limit_mb=2048", "-print_final_stats=1",
           "-artifact_prefix=" + artifacts + "/", "-print_pcs=0", "-reload=0"]
    print("fuzz:", " ".join(os.path.relpath(c, ROOT) if c.startswith(ROOT) else c for c in cmd), flush=True)
    t0 = time.monotonic()
    log = os.path.join(OUT, "last-run.log")
    with open(log, "w") as f:
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=OUT)
    took = time.monotonic() - t0
    text = open(log, errors="replace").read()
    stats = dict(re.findall(r"^stat::(\w+):\s+(\d+)", text, re.M))
    cov = re.findall(r"cov: (\d+) ft: (\d+) corp: (\d+)", text)
    new = sorted(set(os.listdir(artifacts)) - before)
    print("fuzz: %s executions in %.0f s (%s/s), coverage %s edges, %s features, corpus %s inputs; peak RSS %s MB"
          % (stats.get("number_of_executed_units", "?"), took, stats.get("average_exec_per_sec", "?"),
             cov[-1][0] if cov else "?", cov[-1][1] if cov else "?", cov[-1][2] if cov else "?",
             stats.get("peak_rss_mb", "?")))
    if r.returncode != 0 or new:
        print("fuzz: FINDING (exit %d): %s; log %s" % (r.returncode, ", ".join(new) or "none written",
                                                        os.path.relpath(log, ROOT)))
        tail = text[text.find("==ERROR") if "==ERROR" in text else max(0, len(text) - 3000):]
        print(tail[:6000])
        return 1
    print("fuzz: no findings")
    return 0


if __name__ == "__main__":
    sys.exit(main())
