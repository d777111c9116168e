/*
 * Peer for corral's benchmark suite: the C-speed floor of starting a
 * program and waiting for it. One command per line on stdin:
 *
 *     true    posix_spawn("/bin/true") with stdin, stdout and stderr on
 *             /dev/null, then waitpid
 *     kernel CGROUP-BASE WORK-DIR
 *             the kernel work corrald does for one /bin/true under its
 *             cgroup backend, without a daemon: mkdir a cgroup under
 *             CGROUP-BASE and a workspace under WORK-DIR, two pipes
 *             (stdout, stderr), clone3 with CLONE_INTO_CGROUP|CLONE_VFORK
 *             and execve in the workspace, read both pipes to EOF,
 *             waitpid, rmdir the cgroup and the workspace (the
 *             workspace held open across its rmdir and closed after the
 *             time is taken: corrald frees the inode only after it has
 *             answered exec.wait)
 *     kernelrate N MS CGROUP-BASE WORK-DIR
 *             the same kernel work from N worker processes at once (each
 *             forked from this one, single-threaded, looping "kernel"
 *             with names of its own) for MS milliseconds: a worker starts
 *             no round after the deadline, and the window ends when the
 *             last worker has finished its round and exited (each round
 *             closes its workspace's fd inside the window: a rate pays
 *             for the inode's free)
 *     quit    exit
 *
 * For each command it prints one line: the nanoseconds from before
 * posix_spawn to after waitpid (CLOCK_MONOTONIC), a space, and the child's
 * exit status (or -1 and the error). For kernelrate: the nanoseconds of
 * the whole window, a space, and the rounds all workers completed (or 0 -1
 * and the error). glibc's posix_spawn is a
 * clone(CLONE_VM|CLONE_VFORK) and execve: no page tables copied, no pipe.
 * The process lives as long as the suite needs it, so its own start-up is
 * in no figure.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <string.h>
#include <sched.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <linux/sched.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static long long now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* undo_kernel removes what a failed one_kernel made (cg may be NULL: not
 * made), keeping errno; it returns -1. */
static int undo_kernel(const char *cg, const char *ws, const int *fds, int nfds)
{
	int saved = errno;
	for (int i = 0; i < nfds; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	if (cg != NULL)
		rmdir(cg);
	rmdir(ws);
	errno = saved;
	return -1;
}

/* one_kernel does the "kernel" command once; it returns the exit status
 * of the child or -1 with errno set, leaving nothing it made behind. With
 * held non-NULL, the workspace's directory fd (held open across its rmdir)
 * is handed back in *held instead of closed (-1 if none): the close frees
 * the inode, which corrald does only after it has answered exec.wait
 * (releaseWorkspace), so a latency round closes it after its clock stops;
 * a rate round (kernelrate) pays for it inside the round. */
static int one_kernel(const char *cgbase, const char *workdir, const char *tag, long n, int *held)
{
	if (held != NULL)
		*held = -1;
	char cg[512], ws[512];
	snprintf(cg, sizeof cg, "%s/k-%s%ld", cgbase, tag, n);
	snprintf(ws, sizeof ws, "%s/k-%s%ld", workdir, tag, n);
	if (mkdir(ws, 0700) < 0)
		return -1;
	if (mkdir(cg, 0755) < 0)
		return undo_kernel(NULL, ws, NULL, 0);
	int fds[5] = {-1, -1, -1, -1, -1}; /* cgfd, out[0], out[1], err[0], err[1] */
	int cgfd = open(cg, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	fds[0] = cgfd;
	int out[2], err[2];
	if (cgfd < 0 || pipe2(out, O_CLOEXEC) < 0)
		return undo_kernel(cg, ws, fds, 5);
	fds[1] = out[0], fds[2] = out[1];
	if (pipe2(err, O_CLOEXEC) < 0)
		return undo_kernel(cg, ws, fds, 5);
	fds[3] = err[0], fds[4] = err[1];
	struct clone_args ca;
	memset(&ca, 0, sizeof ca);
	ca.flags = CLONE_INTO_CGROUP | CLONE_VFORK;
	ca.exit_signal = SIGCHLD;
	ca.cgroup = (uint64_t)cgfd;
	long pid = syscall(SYS_clone3, &ca, sizeof ca);
	if (pid == 0) {
		dup2(out[1], 1);
		dup2(err[1], 2);
		int null = open("/dev/null", O_RDONLY);
		dup2(null, 0);
		if (chdir(ws) < 0)
			_exit(126);
		char *argv[] = {"/bin/true", NULL};
		execve(argv[0], argv, environ);
		_exit(127);
	}
	if (pid < 0)
		return undo_kernel(cg, ws, fds, 5);
	close(cgfd);
	close(out[1]);
	close(err[1]);
	char buf[4096];
	while (read(out[0], buf, sizeof buf) > 0)
		;
	while (read(err[0], buf, sizeof buf) > 0)
		;
	close(out[0]);
	close(err[0]);
	int st;
	while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
	/* The workspace goes as corrald removes it (removeWorkspaceHeld): with
	 * the directory held open across the rmdir, so that the inode's free
	 * (on this ext4 with online discard, a synchronous discard of its
	 * block) runs at the close, not under the parent directory's lock. */
	int wsfd = open(ws, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int failed = rmdir(cg) < 0 || rmdir(ws) < 0;
	int saved = errno;
	if (wsfd >= 0 && held != NULL)
		*held = wsfd;
	else if (wsfd >= 0)
		close(wsfd);
	if (failed) {
		errno = saved;
		return -1;
	}
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* worker_result is what one kernelrate worker reports on its pipe. */
struct worker_result {
	long rounds;
	int err; /* errno of the failed round, 0 if none failed */
};

/* kernel_rate does the "kernelrate" command: n workers, each looping
 * one_kernel until ms have passed since the start. It prints the answer. */
static void kernel_rate(int n, long ms, const char *cgbase, const char *workdir)
{
	int res[2];
	if (n < 1 || n > 1024 || ms < 1) {
		printf("0 -1 kernelrate: want 1-1024 workers and a window of at least 1 ms\n");
		return;
	}
	if (pipe2(res, O_CLOEXEC) < 0) {
		printf("0 -1 kernelrate: pipe: %s\n", strerror(errno));
		return;
	}
	long long t0 = now_ns();
	long long deadline = t0 + ms * 1000000LL;
	int started = 0, failed = 0;
	for (int w = 0; w < n; w++) {
		pid_t pid = fork();
		if (pid < 0) {
			failed = errno;
			break;
		}
		if (pid == 0) {
			char tag[32];
			snprintf(tag, sizeof tag, "w%d-", w);
			struct worker_result r = {0, 0};
			while (now_ns() < deadline) {
				if (one_kernel(cgbase, workdir, tag, r.rounds, NULL) != 0) {
					r.err = errno ? errno : EIO;
					break;
				}
				r.rounds++;
			}
			(void)!write(res[1], &r, sizeof r);
			_exit(0);
		}
		started++;
	}
	close(res[1]);
	long total = 0;
	struct worker_result r;
	int got = 0;
	while (read(res[0], &r, sizeof r) == (ssize_t)sizeof r) {
		got++;
		total += r.rounds;
		if (r.err != 0 && failed == 0)
			failed = r.err;
	}
	close(res[0]);
	for (int i = 0; i < started; i++) {
		int st;
		while (wait(&st) < 0 && errno == EINTR)
			;
	}
	long long t1 = now_ns();
	if (failed != 0 || got != n)
		printf("0 -1 kernelrate: %d of %d workers answered: %s\n", got, n, strerror(failed ? failed : EIO));
	else
		printf("%lld %ld\n", t1 - t0, total);
}

int main(void)
{
	long kernel_n = 0;
	char line[1024];
	int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
	if (devnull < 0) {
		perror("open /dev/null");
		return 1;
	}
	posix_spawn_file_actions_t fa;
	posix_spawn_file_actions_init(&fa);
	for (int fd = 0; fd < 3; fd++)
		posix_spawn_file_actions_adddup2(&fa, devnull, fd);
	char *argv[] = {"/bin/true", NULL};
	setvbuf(stdout, NULL, _IOLBF, 0);
	while (fgets(line, sizeof line, stdin)) {
		if (strncmp(line, "quit", 4) == 0)
			break;
		if (strncmp(line, "kernel ", 7) == 0) {
			char cgbase[480], workdir[480];
			if (sscanf(line + 7, "%479s %479s", cgbase, workdir) != 2) {
				printf("0 -1 want: kernel CGROUP-BASE WORK-DIR\n");
				continue;
			}
			long long t0 = now_ns();
			int held;
			int code = one_kernel(cgbase, workdir, "", kernel_n++, &held);
			long long t1 = now_ns();
			if (held >= 0)
				close(held); /* after the answer, as corrald */
			if (code < 0)
				printf("0 -1 kernel: %s\n", strerror(errno));
			else
				printf("%lld %d\n", t1 - t0, code);
			continue;
		}
		if (strncmp(line, "kernelrate ", 11) == 0) {
			char cgbase[480], workdir[480];
			int n;
			long ms;
			if (sscanf(line + 11, "%d %ld %479s %479s", &n, &ms, cgbase, workdir) != 4) {
				printf("0 -1 want: kernelrate N MS CGROUP-BASE WORK-DIR\n");
				continue;
			}
			fflush(stdout); /* nothing buffered for the workers to copy */
			kernel_rate(n, ms, cgbase, workdir);
			continue;
		}
		if (strncmp(line, "true", 4) != 0) {
			printf("0 -1 unknown command\n");
			continue;
		}
		pid_t pid;
		long long t0 = now_ns();
		int err = posix_spawn(&pid, argv[0], &fa, NULL, argv, environ);
		if (err != 0) {
			printf("0 -1 posix_spawn: %s\n", strerror(err));
			continue;
		}
		int st;
		while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
			;
		long long t1 = now_ns();
		printf("%lld %d\n", t1 - t0, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
	}
	return 0;
}
