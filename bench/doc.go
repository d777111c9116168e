// Package bench measures corrald against baselines run side by side in the
// same run: exec-to-result latency (warm pool on and off, each store, against
// a bare os/exec Run and the seed's asyncio run_limited), exit-to-notification
// latency, executions per second with 1, 8 and 64 clients, output drain
// throughput, the cost per running child at the fd limit's count, corrald
// under systemd against systemd-run, and CPU profiles of the daemon's hot
// paths run in-process.
//
// Timing goals are checked here as ratios against an interleaved baseline,
// never as timed assertions in tests. The suite is TestBenchSuite; it skips
// unless CORRAL_BENCH=1 (make bench sets it) and needs root and a writable
// cgroup2 hierarchy. It builds corrald itself, starts its own daemons on
// temporary sockets and cgroups (each with an explicit --pool-size), and
// removes all of them afterwards. Results go to the test log as tables and,
// when CORRAL_BENCH_OUT names a file, as Markdown to that file
// (docs/benchmarks.md quotes it).
package bench
