"""Waits until the file named by GATE_FILE exists, then prints LINES numbered lines of about 120 bytes as fast as
it can and exits: more than a pipe holds, written while (in the test) nobody reads the node agent's output."""

import os
import sys
import time

gate = os.environ["GATE_FILE"]
while not os.path.exists(gate):
    time.sleep(0.05)
for number in range(int(os.environ.get("LINES", "3000"))):
    print(f"burst line {number:05d} " + "x" * 100)
sys.stdout.flush()
