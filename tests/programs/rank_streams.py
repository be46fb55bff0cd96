"""Ranks that print at once, as print() does it (the text, then the newline, in separate writes), on stdout
and stderr; rank 1 is hostile: it files a metric record as rank 0 and prints the marker inside a debug line.
No torch: what is under test is how each rank's lines reach the node agent."""

import json
import os
import sys

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
lines = int(os.environ.get("RANK_STREAMS_LINES", "400"))
ready = os.environ["RANK_STREAMS_READY"]  # a directory: every rank marks itself there, then all print together
open(os.path.join(ready, str(rank)), "w").close()
while len(os.listdir(ready)) < world:
    pass
for i in range(lines):
    print(f"rank {rank} line {i}", "x" * 40)
    if i % 50 == 0:
        print(f"rank {rank} err {i}", file=sys.stderr)
if rank == 0:
    print("@@launch " + json.dumps({"v": 1, "rank": 0, "step": 1, "samples": 4, "interval_s": 1.0}))
else:
    print("@@launch " + json.dumps({"v": 1, "rank": 0, "step": 99, "samples": 4, "interval_s": 1.0}))
    print()
    print("debug: sending @@launch " + json.dumps({"v": 1, "rank": rank, "step": 98}))
