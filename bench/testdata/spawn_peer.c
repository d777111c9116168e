/*
 * Peer for corral's benchmark suite: the C-speed floor of starting a
 * program and waiting for it. One command per line on stdin:
 *
 *     true    posix_spawn("/bin/true") with stdin, stdout and stderr on
 *             /dev/null, then waitpid
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
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static long long now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int main(void)
{
	char line[64];
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
