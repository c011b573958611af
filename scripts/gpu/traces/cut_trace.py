"""Cut a PyTorch memory snapshot to its last N trace events (as a smaller history ring
would have recorded), for benchmarks at several sizes. Plain pickle: no torch needed.

usage: python3 cut_trace.py IN.pickle.gz OUT.pickle.gz N
"""
import gzip
import pickle
import sys


def main():
    src, dst, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with gzip.open(src, "rb") as f:
        snap = pickle.load(f)
    snap["device_traces"] = [t[-n:] for t in snap["device_traces"]]
    with gzip.open(dst, "wb", compresslevel=6) as f:
        pickle.dump(snap, f, protocol=4)


if __name__ == "__main__":
    main()
