/*
 * The pod sandbox's process, for the pause image hack/realnode.sh builds (no registry needed).
 * It holds the pod's namespaces open: it sleeps, reaps whatever zombies the pod's shared PID
 * namespace hands it (it is PID 1 there), and exits 0 on SIGINT or SIGTERM, as upstream's does.
 * Built with `gcc -static`: the image holds nothing else.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_stop(int sig) {
	(void)sig;
	_exit(0);
}

static void on_child(int sig) {
	(void)sig;
	while (waitpid(-1, NULL, WNOHANG) > 0) {
	}
}

int main(void) {
	struct sigaction sa;

	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_stop;
	if (sigaction(SIGINT, &sa, NULL) < 0 || sigaction(SIGTERM, &sa, NULL) < 0) {
		perror("pause: sigaction");
		return 1;
	}
	sa.sa_handler = on_child;
	sa.sa_flags = SA_NOCLDSTOP;
	if (sigaction(SIGCHLD, &sa, NULL) < 0) {
		perror("pause: sigaction");
		return 1;
	}
	if (getpid() != 1)
		fprintf(stderr, "pause: warning: not PID 1, children of others will not be reaped\n");
	for (;;)
		pause();
	return 42; /* not reached */
}
