/*
 * The pod sandbox's PID 1 for the real-cluster lane (localhost/topology-e2e-pause), written for this project.
 *
 * It holds the pod's namespaces and does nothing else:
 *   - SIGINT or SIGTERM: exit 0 (the runtime stops a sandbox with SIGTERM, then SIGKILL);
 *   - SIGCHLD: reap every exited child (with a shared PID namespace the sandbox is the pod's init);
 *   - otherwise sleep in pause() for ever.
 * Built static (gcc -static -Os), so the image holds this one file.
 * `/pause -v` prints a version line and exits 0 (a smoke test that needs no signal).
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define VERSION "topology-e2e-pause 3.10"

static void on_stop(int signo) {
    (void)signo;
    _exit(0);
}

static void on_child(int signo) {
    int saved = errno;
    (void)signo;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
    errno = saved;
}

static int install(int signo, void (*handler)(int)) {
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = handler;
    action.sa_flags = signo == SIGCHLD ? SA_NOCLDSTOP | SA_RESTART : SA_RESTART;
    sigemptyset(&action.sa_mask);
    return sigaction(signo, &action, NULL);
}

int main(int argc, char **argv) {
    if (argc > 1 && (strcmp(argv[1], "-v") == 0 || strcmp(argv[1], "--version") == 0)) {
        puts(VERSION);
        return 0;
    }
    if (getpid() != 1) {
        fprintf(stderr, "pause: warning: not PID 1 (pid %ld)\n", (long)getpid());
    }
    if (install(SIGINT, on_stop) != 0 || install(SIGTERM, on_stop) != 0 || install(SIGCHLD, on_child) != 0) {
        perror("pause: sigaction");
        return 1;
    }
    for (;;) {
        pause();
    }
}
