#!/usr/bin/env python3
"""Count memory ops that read HBM bytes before an earlier-issued write of the
same PE (same pe_dma component) to those bytes has ended (issue 32).
Usage: kb-inspect ops TRACE --format jsonl | scripts/check-order.py"""
import sys, json
from collections import defaultdict
def rows(r):
    pa=int(r["pa"],16); 
    for i in range(r["rows"]):
        yield (pa+i*r["stride"], pa+i*r["stride"]+r["len"])
def hbm(r): return "hbm" in r.get("at","")
ops=defaultdict(list)
n_reads=0
for line in sys.stdin:
    o=json.loads(line)
    if o["kind"]!="memory" or not o["component"].endswith("pe_dma"): continue
    ops[o["component"]].append(o)
bad=0; worst=0; reads=0
for comp, lst in ops.items():
    lst.sort(key=lambda o:o["op_id"])
    writes=[]  # (op_id, t_end, intervals)
    for o in lst:
        rd=[iv for r in (o.get("read") or {}).get("ranges",[]) if hbm(r) for iv in rows(r)]
        if rd:
            reads+=1
            rd.sort()
            early=0
            for (wid, wend, wivs) in writes:
                if wend <= o["t_start_ps"]: continue
                # overlap?
                if any(a<d and c<b for (a,b) in rd for (c,d) in wivs):
                    early=max(early, wend-o["t_start_ps"])
            if early>0:
                bad+=1; worst=max(worst,early)
        wr=[iv for r in (o.get("write") or {}).get("ranges",[]) if hbm(r) for iv in rows(r)]
        if wr:
            writes.append((o["op_id"], o["t_end_ps"], wr))
            # drop writes long ended
print(f"{bad} of {reads} HBM reads start before an earlier-issued write of the same PE ends (worst {worst/1000:.1f} ns)")
