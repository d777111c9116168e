// Package bench measures corrald against baselines run side by side in the
// same process and the same run: exec-to-result latency, exit-to-notification
// latency of the pidfd loop, the cost per running child, executions per
// second and output drain throughput.
//
// Timing goals are checked here as ratios against an interleaved baseline,
// never as timed assertions in tests. The suite is TestBenchSuite; it skips
// unless CORRAL_BENCH=1 (make bench sets it) and needs root and a writable
// cgroup2 hierarchy. It builds corrald itself, starts its own daemons on
// temporary sockets and cgroups, and removes all of them afterwards. Results
// go to the test log as tables and, when CORRAL_BENCH_OUT names a file, as
// Markdown to that file (docs/benchmarks.md quotes it).
package bench
