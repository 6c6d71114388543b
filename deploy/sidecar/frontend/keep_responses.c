/*
 * The response keeper, preloaded into tritonserver (LD_PRELOAD).
 *
 * Triton's HTTP frontend hands each generate_stream response to the event thread of its
 * connection with libevhtp's evthr_defer: a 17-byte command sent on a non-blocking AF_UNIX
 * socket pair, whose failure is ignored. When the event thread is behind by as many commands
 * as the socket's buffer holds, send() fails with EAGAIN and the response is lost.
 *
 * This send() waits for room and sends again instead, for such commands only: 17 bytes, no
 * MSG_DONTWAIT, an AF_UNIX socket. The thread that completes a response then waits for the
 * event thread, as gRPC's flow control makes it wait for a slow client. The wait is bounded
 * (KEEP_WAIT_MS), so a command deferred by the event thread to itself is lost as before
 * rather than blocking it for good. Every other call returns what libc's send() returns.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/types.h>

#define EVTHR_COMMAND_BYTES 17
#define KEEP_WAIT_MS 10000
#define POLL_MS 100

typedef ssize_t (*send_fn)(int, const void *, size_t, int);
static send_fn libc_send;

__attribute__((constructor)) static void keeper_init(void) {
    libc_send = (send_fn)dlsym(RTLD_NEXT, "send");
}

static int is_unix_socket(int fd) {
    int domain = 0;
    socklen_t size = sizeof domain;
    return getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &size) == 0 && domain == AF_UNIX;
}

static int full(ssize_t sent) {
    return sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

ssize_t send(int fd, const void *buf, size_t len, int flags) {
    if (libc_send == NULL) {
        keeper_init();
    }
    ssize_t sent = libc_send(fd, buf, len, flags);
    if (!full(sent) || len != EVTHR_COMMAND_BYTES || (flags & MSG_DONTWAIT) || !is_unix_socket(fd)) {
        if (full(sent)) {
            errno = EAGAIN;
        }
        return sent;
    }
    for (int waited_ms = 0; waited_ms < KEEP_WAIT_MS; waited_ms += POLL_MS) {
        struct pollfd room = {.fd = fd, .events = POLLOUT};
        if (poll(&room, 1, POLL_MS) < 0 && errno != EINTR) {
            return -1;
        }
        sent = libc_send(fd, buf, len, flags);
        if (!full(sent)) {
            return sent;
        }
    }
    errno = EAGAIN;
    return sent;
}
