/*
 * Holder for the bound of corral's benchmark (f): the least a process
 * waiting in a transient systemd scope can be. It blocks in read(2) on
 * stdin; one byte released it, and it execs /bin/true at once (stdout and
 * stderr are whatever it was started with: /dev/null). stdin closed
 * without a byte (the benchmark discarding it) makes it exit 3 without
 * exec. Compiled with cc -O2 by the suite, as spawn_peer.c is.
 */
#include <errno.h>
#include <unistd.h>

int main(void)
{
	char c;
	ssize_t n;

	do
		n = read(0, &c, 1);
	while (n < 0 && errno == EINTR);
	if (n != 1)
		return 3;
	execl("/bin/true", "/bin/true", (char *)0);
	return 127;
}
