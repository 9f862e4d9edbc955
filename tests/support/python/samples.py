"""tests/support/python/samples.py: checks the record of DPT_DEBUG_SAMPLE_LOG (trainer/fault_injection.h), one line
per micro-batch a rank trained:
    round R from F step S epoch E rank K world W: I1 I2 ...
A step trained again after a failure appears again with a greater (R, F): per step, only the lines of the greatest
(R, F) count (the others were lost with the run that trained them). Command:
  samples.py exactly_once LOG N EPOCHS [WORLD_SIZES]
      every epoch 0..EPOCHS-1 used each of the N examples exactly once, counting the steps that count; with
      WORLD_SIZES (comma-separated, e.g. 2,1), an epoch's steps ran at exactly those world sizes, in that order, in
      some epoch (the resize the test meant to make did happen mid-epoch). Prints a summary; exit 1 if not.
"""
import collections
import re
import sys

LINE = re.compile(r"^round (\d+) from (\d+) step (\d+) epoch (\d+) rank (\d+) world (\d+):((?: \d+)*)$")


def counted_steps(path):
    """{step: (epoch, world, [indices of every rank's micro-batches])} for the lines that count."""
    by_step = collections.defaultdict(lambda: collections.defaultdict(list))
    with open(path) as f:
        for n, line in enumerate(f, 1):
            m = LINE.match(line.rstrip("\n"))
            if not m:
                sys.exit(f"{path}:{n}: not a sample record: {line[:80]!r}")
            rnd, frm, step, epoch, rank, world = map(int, m.groups()[:6])
            by_step[step][(rnd, frm)].append((epoch, world, [int(i) for i in m.group(7).split()]))
    out = {}
    for step, tags in by_step.items():
        lines = tags[max(tags)]
        epochs = {e for e, _, _ in lines}
        worlds = {w for _, w, _ in lines}
        if len(epochs) != 1 or len(worlds) != 1:
            sys.exit(f"step {step}: lines of several epochs {sorted(epochs)} or world sizes {sorted(worlds)}")
        out[step] = (epochs.pop(), worlds.pop(), [i for _, _, idx in lines for i in idx])
    return out


def exactly_once(path, n, epochs, worlds=None):
    steps = counted_steps(path)
    ok = True
    resized = worlds is None
    for epoch in range(epochs):
        mine = sorted(s for s, (e, _, _) in steps.items() if e == epoch)
        if not mine:
            print(f"epoch {epoch}: no step recorded")
            ok = False
            continue
        if mine != list(range(mine[0], mine[-1] + 1)):
            print(f"epoch {epoch}: steps {mine[0]}..{mine[-1]} with gaps")
            ok = False
        count = collections.Counter(i for s in mine for i in steps[s][2])
        missing = [i for i in range(n) if count[i] == 0]
        repeated = [i for i, c in count.items() if c > 1]
        outside = [i for i in count if not 0 <= i < n]
        sequence = [w for k, w in enumerate(steps[s][1] for s in mine) if k == 0 or steps[mine[k - 1]][1] != w]
        if worlds is not None and sequence == worlds:
            resized = True
        print(f"epoch {epoch}: steps {mine[0]}..{mine[-1]}, world sizes {sequence}, {sum(count.values())} examples "
              f"trained, {len(count)} distinct, {len(missing)} missing, {len(repeated)} repeated")
        if missing or repeated or outside:
            print(f"  missing {missing[:10]} repeated {repeated[:10]} outside {outside[:10]}")
            ok = False
    if not resized:
        print(f"no epoch ran at world sizes {worlds} in that order")
        ok = False
    return ok


if __name__ == "__main__":
    if len(sys.argv) < 5 or sys.argv[1] != "exactly_once":
        sys.exit(__doc__)
    worlds = [int(w) for w in sys.argv[5].split(",")] if len(sys.argv) > 5 else None
    sys.exit(0 if exactly_once(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), worlds) else 1)
