"""A rank's output in the forms programs write it, knowing nothing of `launch`: a tqdm bar on stderr (redrawn with
carriage returns), an empty line, and lines alternating between stdout and stderr. No torch."""

import sys

from tqdm import tqdm

for _ in tqdm(range(3), desc="epoch", file=sys.stderr, mininterval=0, ascii=True, bar_format="{desc}: {n_fmt}/{total_fmt}"):
    pass
print()
for i in range(0, 10, 2):
    print(f"in order {i}")
    print(f"in order {i + 1} (stderr)", file=sys.stderr)
