#!/usr/bin/env python3
"""Where a kb-sim run's CPU goes, by category: reads `perf script` output
(a `perf record -e cpu-clock --call-graph dwarf` profile) on stdin and
files each sample under the first frame, from the leaf up, that matches
a category (so a memcpy called by the race detector counts as race
detection). Issue 14's share figures in BENCHMARKS.md come from this.

    perf record -e cpu-clock --call-graph dwarf,16384 -F 1000 -o p.data kb-sim ...
    perf script -i p.data | scripts/perf-shares.py
    perf script -i p.data | scripts/perf-shares.py --event-loop

`--event-loop` leaves out the samples of setup (the workload's build and
its random inputs) and of the trace's end (tensor data, the channels
chunk): what is left is the event loop and the kernels it runs. Record
with `dwarf,65528`: with 16 KiB stack dumps most stacks stop before the
frames that say where a sample belongs.
"""
import sys, re, collections
cats = [
 ("race detection", re.compile(r"kb_sim::race::|race_check")),
 ("pending ranges", re.compile(r"clear_pending|first_pending|unknown_in|mark_unknown|mark_pending|pending_in|clear_extents")),
 ("data movement", re.compile(r"DataPlane::(snapshot|land|write_snapshot|read_partial|append|write_bytes|write_extent|write\b|read\b)|^(land|write_snapshot|snapshot)$|Snapshot::|fingerprint|xxhash|scatter")),
 ("translation", re.compile(r"::resolve|::translate|check_pa|PageRuns|fold_rows|resolve_la")),
 ("allocation", re.compile(r"^(malloc|_int_malloc|_int_free|cfree|free|realloc|_int_realloc|__libc_calloc|__memset|alloc::raw_vec|finish_grow)")),
 ("HBM/NoC timing", re.compile(r"HbmController|ChannelUsage|Machine::route|send_streamed|Link|hbm_channel|burst_share|ser\b|ceil")),
 ("event queue", re.compile(r"EventQueue|BinaryHeap")),
 ("trace writing", re.compile(r"RecordEncoder|TraceWriter|hook_|record_codec|writer::")),
 ("kernel + handshake", re.compile(r"kb_workloads|kernel::|corosensei|Coroutine|YieldPort|step_program|run_command")),
]
def strip_generics(sym):
    """`act<kb_format::writer::AtomicFile>` -> `act`: a frame is filed by
    its own name, not by the types it was instantiated with (the writer
    type in every engine frame's parameters made them all "trace
    writing"). A qualified path (`<HbmController as Component>::serve_read`)
    keeps its `<...>`: only arguments after a name go."""
    out, depth = [], 0
    for i, ch in enumerate(sym):
        if depth == 0 and ch == "<" and i > 0 and (sym[i - 1].isalnum() or sym[i - 1] == "_"):
            depth = 1
        elif depth > 0:
            depth += {"<": 1, ">": -1}.get(ch, 0)
        else:
            out.append(ch)
    return "".join(out)

outside = None
if sys.argv[1:] == ["--event-loop"]:
    outside = re.compile(r"Workload>::build|Program::new|random_data|TraceWriter::tensor_data|finish_with_launches")
elif len(sys.argv) != 1:
    sys.exit("usage: perf-shares.py [--event-loop] < perf-script-output")

counts = collections.Counter(); total = 0
stack = []
def flush():
    global total
    if not stack: return
    if outside and any(outside.search(fr) for fr in stack): return
    total += 1
    for fr in stack:
        for name, rx in cats:
            if rx.search(fr):
                counts[name] += 1; return
    counts["other (engine dispatch, ...)"] += 1
for line in sys.stdin:
    line = line.rstrip("\n")
    if not line.strip():
        flush(); stack = []; continue
    if line.startswith((" ", "\t")):
        parts = line.strip().split(None, 1)
        if len(parts) == 2:
            sym = re.sub(r"\+0x[0-9a-f]+$", "", parts[1].split(" (")[0])
            stack.append(strip_generics(sym))
flush()
for k, v in counts.most_common():
    print(f"{k:32s} {100*v/total:5.1f} %")
print("samples", total)
