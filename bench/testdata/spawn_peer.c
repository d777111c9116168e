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
 *             waitpid, rmdir the cgroup and the workspace
 *     quit    exit
 *
 * For each command it prints one line: the nanoseconds from before
 * posix_spawn to after waitpid (CLOCK_MONOTONIC), a space, and the child's
 * exit status (or -1 and the error). glibc's posix_spawn is a
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

/* one_kernel does the "kernel" command once; it returns the exit status
 * of the child or -1 with errno set. */
static int one_kernel(const char *cgbase, const char *workdir, long n)
{
	char cg[512], ws[512];
	snprintf(cg, sizeof cg, "%s/k-%ld", cgbase, n);
	snprintf(ws, sizeof ws, "%s/k-%ld", workdir, n);
	if (mkdir(ws, 0700) < 0)
		return -1;
	if (mkdir(cg, 0755) < 0)
		return -1;
	int cgfd = open(cg, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int out[2], err[2];
	if (cgfd < 0 || pipe2(out, O_CLOEXEC) < 0 || pipe2(err, O_CLOEXEC) < 0)
		return -1;
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
		return -1;
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
	if (rmdir(cg) < 0 || rmdir(ws) < 0)
		return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
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
			int code = one_kernel(cgbase, workdir, kernel_n++);
			long long t1 = now_ns();
			if (code < 0)
				printf("0 -1 kernel: %s\n", strerror(errno));
			else
				printf("%lld %d\n", t1 - t0, code);
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
