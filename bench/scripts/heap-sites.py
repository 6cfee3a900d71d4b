#!/usr/bin/env python3
"""Per-connection bytes by allocation site, from a heap profile's `go tool pprof -raw` text.

Each sample's stack (inlined frames included) is put under its first frame outside the
standard library, hashbrown and the allocator (the code that asked for the memory), and
its bytes are divided by the number of connections. Prints the sites, then the stacks
(their first nine such frames, tokio's scheduler frames left out) with what they hold.
Usage: go tool pprof -raw heap.pb.gz > raw.txt && heap-sites.py raw.txt CONNECTIONS
(bench/scripts/idle-profile.sh runs it.)
"""
import re, sys, collections
raw = open(sys.argv[1]).read().splitlines()
n = int(sys.argv[2])
i = raw.index('Samples:') + 2
samples = []
while i < len(raw) and raw[i].strip() and not raw[i].startswith('Locations'):
    v, locs = raw[i].split(':', 1)
    samples.append((int(v), [int(x) for x in locs.split()]))
    i += 1
while not raw[i].startswith('Locations'): i += 1
i += 1
locs = {}
cur = None
while i < len(raw) and not raw[i].startswith('Mappings'):
    line = raw[i]
    m = re.match(r'\s+(\d+): 0x[0-9a-f]+ M=\d+ (.*)', line)
    if m:
        cur = int(m.group(1)); locs[cur] = [m.group(2)]
    elif line.strip():
        locs[cur].append(line.strip())
    i += 1
def parse(fr):
    # "name file:line s=0(detail)"
    m = re.match(r'(.*?) (\S+):(\d+) s=\d+(?:\((.*)\))?$', fr)
    if not m: return fr, '', 0, ''
    return m.group(1), m.group(2), int(m.group(3)), m.group(4) or ''
STD = ('/rustc/', 'hashbrown', 'tikv-jemallocator', '/server/src/main.rs')
def short(f):
    f = re.sub(r'.*/index.crates.io-[0-9a-f]+/', '', f)
    f = re.sub(r'.*/wt-[a-z0-9]+/', '', f)
    return f
by_site = collections.Counter(); by_pair = collections.Counter(); total = 0
for v, ls in samples:
    frames = []
    for l in ls:
        frames.extend(locs.get(l, []))
    pf = [parse(f) for f in frames]
    site = next((p for p in pf if not any(s in p[1] for s in STD)), None)
    own = next((p for p in pf if '/server/src/' in p[1] and 'main.rs' not in p[1]), None)
    sk = f"{short(site[1])}:{site[2]} {site[0]}" if site else '?'
    ok = f"{short(own[1])}:{own[2]} {own[0]}" if own else '-'
    by_site[sk] += v; by_pair[(sk, ok)] += v; total += v
print(f"total {total} B, {total/n:.0f} B per connection")
print("--- by allocation site (first frame outside std), B per connection")
for k, v in by_site.most_common(40):
    print(f"{v/n:8.1f}  {k}")
print("--- by (site, first im-server frame)")
for (k, o), v in by_pair.most_common(60):
    if v/n < 8: break
    print(f"{v/n:8.1f}  {k}\n          <- {o}")
print("--- stacks (non-std frames, innermost first), B per connection")
by_stack = collections.Counter()
for v, ls in samples:
    frames = []
    for l in ls:
        frames.extend(locs.get(l, []))
    pf = [parse(f) for f in frames]
    ns = [f"{short(p[1])}:{p[2]} {p[0]}" for p in pf if not any(s in p[1] for s in STD)]
    # drop runtime plumbing at the outer end
    ns = [x for x in ns if 'runtime/' not in x or 'task/core' in x or 'io/driver' in x][:9]
    by_stack[tuple(ns)] += v
for k, v in by_stack.most_common(45):
    if v/n < 5: break
    print(f"{v/n:8.1f}")
    for x in k: print("            ", x)
