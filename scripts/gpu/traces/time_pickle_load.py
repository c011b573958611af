"""CPython's own pickle.load of a gzipped snapshot: wall time and peak RSS, to set beside
`vramtop bench replay`. usage: python3 time_pickle_load.py FILE.pickle.gz"""
import gzip
import pickle
import resource
import sys
import time

start = time.perf_counter()
with gzip.open(sys.argv[1], "rb") as f:
    snap = pickle.load(f)
took = time.perf_counter() - start
events = sum(len(t) for t in snap["device_traces"])
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
print(f"{sys.argv[1]}: {events} events, pickle.load {took:.2f} s, peak RSS {peak} MiB")
