/* tenantnet trampoline: the compiled fast path of the `tenantnet` and `tenantnet-ipam`
 * executables.
 *
 * The reference is the Python shim, tenantnet/entry/shim.py (the protocol is documented at its
 * top, and in docs/agent.md). This program does only the shim's fast path: forward env + stdin
 * to the node's agent and print its answer. Python's start (~15 ms) dominated that path; an
 * exec of this static binary costs well under a millisecond.
 *
 * Everything else is handed to the Python shim, `<dir of this binary>/<name>-shim`, by
 * execve, with the stdin bytes already read given back on fd 0 (a memfd):
 *   - no agent (connect: ENOENT, ENOTDIR, ECONNREFUSED, EACCES), a socket served by a uid
 *     neither root nor ours (SO_PEERCRED: nothing is sent to it), or stdin over the limit:
 *     the environment unchanged; the Python shim decides (in-process run, STATUS code 50,
 *     the code-6 refusal, the warning line for the wrong uid) exactly as without this program;
 *   - the agent failed once the connection was attempted (time-out, EOF, short or garbled
 *     answer, other connect errors): TENANTNET_SHIM_FAILURE=<reason> is added, and the Python
 *     shim prints the code-11 error for it without contacting an agent: the agent may still
 *     be executing the request, and a second execution beside it is what must never happen.
 * The error documents stay in Python (they need the config's cniVersion, i.e. JSON).
 *
 * Standard C library and glibc's system-call wrappers only. Build:
 *   cc -std=c11 -O2 -Wall -Wextra -Werror -D_GNU_SOURCE -static -o tenantnet trampoline.c
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define MAGIC "tenantnet/1"
#define MAX_STDIN (1 << 20)  /* = shim.MAX_STDIN: one byte more is read to see "too much" */
#define MAX_FRAME (64 << 20) /* = shim.MAX_FRAME: bounds a corrupt length, not an answer */
#define MAX_CONFIG (1 << 20) /* = nodepath.MAX_CONFIG_BYTES */
#define DEFAULT_CONFIG "/etc/tenantnet/tenantnet.yaml"
#define DEFAULT_SOCKET "/run/tenantnet/agent.sock"
#define DEFAULT_TIMEOUT 60.0
#define FAILURE_ENV "TENANTNET_SHIM_FAILURE"

extern char **environ;

static char **args;              /* our argv, passed on to the Python shim */
static char shim[PATH_MAX + 32]; /* <dir of /proc/self/exe>/<name>-shim */
static char *in;                 /* the stdin bytes read */
static size_t in_len;

typedef struct {
    char *p;
    size_t len;
} buf_t;

static double monotonic(void) {
    /* As CPython's time.monotonic(): nanoseconds as a double, divided once. */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)((int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec) / 1e9;
}

/* Wait until fd is ready for `events` or the deadline (< 0: none) passes: 1 ready, 0 not. */
static int wait_for(int fd, short events, double deadline) {
    for (;;) {
        int ms = -1;
        if (deadline >= 0) {
            double left = deadline - monotonic();
            if (left <= 0)
                return 0;
            ms = (int)(left * 1000) + 1;
        }
        struct pollfd p = {.fd = fd, .events = events};
        int r = poll(&p, 1, ms);
        if (r > 0)
            return 1;
        if (r < 0 && errno != EINTR)
            return 1; /* let the read/write that follows report the error */
    }
}

static int write_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN) { /* a non-blocking descriptor from the caller */
                wait_for(fd, POLLOUT, -1);
                continue;
            }
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Read fd to EOF or `limit` bytes. 0 done, -1 on a read error (b keeps what was read). */
static int read_bounded(int fd, size_t limit, buf_t *b) {
    size_t cap = 0;
    b->p = NULL;
    b->len = 0;
    while (b->len < limit) {
        if (b->len == cap) {
            cap = cap ? cap * 2 : 65536;
            if (cap > limit)
                cap = limit;
            char *p = realloc(b->p, cap);
            if (!p)
                return -1;
            b->p = p;
        }
        ssize_t r = read(fd, b->p + b->len, cap - b->len);
        if (r == 0)
            return 0;
        if (r < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN) {
                wait_for(fd, POLLIN, -1);
                continue;
            }
            return -1;
        }
        b->len += (size_t)r;
    }
    return 0;
}

static const char *basename_of(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

static int is_plugin(const char *name) {
    return strcmp(name, "tenantnet") == 0 || strcmp(name, "tenantnet-ipam") == 0;
}

/* The value of the first `key=` entry of environ (what posix.environ keeps), or NULL. */
static const char *env_get(const char *key) {
    size_t k = strlen(key);
    for (char **e = environ; *e; e++)
        if (strncmp(*e, key, k) == 0 && (*e)[k] == '=')
            return *e + k + 1;
    return NULL;
}

static int is_space(char c) { /* bytes.strip()'s and float()'s whitespace */
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* shim.timeout_of: TENANTNET_AGENT_TIMEOUT as Python's float() reads it, 0 < v <= 3600. */
static double timeout_of(void) {
    const char *v = env_get("TENANTNET_AGENT_TIMEOUT");
    if (!v || !*v)
        return DEFAULT_TIMEOUT;
    const char *s = v, *e = v + strlen(v);
    while (s < e && is_space(*s))
        s++;
    while (e > s && is_space(e[-1]))
        e--;
    char num[256];
    size_t n = 0;
    for (const char *p = s; p < e; p++) {
        if (*p == '_') { /* float() allows '_' between digits only */
            if (p == s || p + 1 == e || (unsigned)(p[-1] - '0') > 9 || (unsigned)(p[1] - '0') > 9)
                return DEFAULT_TIMEOUT;
            continue;
        }
        if (*p == 'x' || *p == 'X' || n + 1 >= sizeof num) /* strtod reads hex; float() not */
            return DEFAULT_TIMEOUT;
        num[n++] = *p;
    }
    num[n] = 0;
    char *end;
    double d = strtod(num, &end);
    if (n == 0 || end != num + n)
        return DEFAULT_TIMEOUT;
    return d > 0 && d <= 3600 ? d : DEFAULT_TIMEOUT;
}

/* nodepath.agent_socket_of: the first top-level `agentSocket:` line with a value (a ` #`
 * comment cut, whitespace stripped, matching quotes removed); else the default. */
static buf_t agent_socket(void) {
    const char *path = env_get("TENANTNET_CONFIG");
    buf_t def = {DEFAULT_SOCKET, sizeof DEFAULT_SOCKET - 1}, data;
    int fd = open(path && *path ? path : DEFAULT_CONFIG, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return def;
    int r = read_bounded(fd, MAX_CONFIG, &data);
    close(fd);
    if (r < 0) /* Python's read raises OSError: the default */
        return def;
    static const char key[] = "agentSocket:";
    for (char *line = data.p, *end = data.p + data.len; line && line < end;) {
        char *nl = memchr(line, '\n', (size_t)(end - line));
        char *stop = nl ? nl : end;
        if ((size_t)(stop - line) >= sizeof key - 1 && memcmp(line, key, sizeof key - 1) == 0) {
            char *v = line + sizeof key - 1;
            char *hash = memmem(v, (size_t)(stop - v), " #", 2);
            char *ve = hash ? hash : stop;
            while (v < ve && is_space(*v))
                v++;
            while (ve > v && is_space(ve[-1]))
                ve--;
            if (ve - v >= 2 && *v == ve[-1] && (*v == '\'' || *v == '"'))
                v++, ve--;
            if (ve > v)
                return (buf_t){v, (size_t)(ve - v)};
        }
        line = nl ? nl + 1 : NULL;
    }
    return def;
}

/* Environment entries in order, `=` required, the first of each key only (CPython's
 * posix.environ), without FAILURE_ENV (it is ours, never the caller's). */
static const char **env_entries(size_t *count) {
    size_t n = 0;
    while (environ[n])
        n++;
    const char **out = malloc((n + 2) * sizeof *out);
    if (!out)
        return NULL;
    size_t m = 0;
    /* Quadratic in the number of entries would be slow for a huge environment: hash keys. */
    size_t slots = 16;
    while (slots < 2 * n)
        slots *= 2;
    const char **seen = calloc(slots, sizeof *seen);
    if (!seen)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        const char *e = environ[i], *eq = strchr(e, '=');
        if (!eq)
            continue;
        size_t k = (size_t)(eq - e), h = 2166136261u;
        for (size_t j = 0; j < k; j++)
            h = (h ^ (unsigned char)e[j]) * 16777619u;
        int dup = 0;
        for (h &= slots - 1; seen[h]; h = (h + 1) & (slots - 1))
            if (strncmp(seen[h], e, k + 1) == 0) {
                dup = 1;
                break;
            }
        if (dup)
            continue;
        seen[h] = e;
        if (k == sizeof FAILURE_ENV - 1 && memcmp(e, FAILURE_ENV, k) == 0)
            continue;
        out[m++] = e;
    }
    free(seen);
    out[m] = NULL;
    *count = m;
    return out;
}

/* The Python shim could not be run: nothing else can answer. A minimal CNI error (code 5, I/O
 * failure; in the current cniVersion, as reading the config's would need a JSON parser). */
static _Noreturn void no_shim(const char *what, int err) {
    char msg[2 * PATH_MAX + 256], out[4 * sizeof msg];
    snprintf(msg, sizeof msg, "tenantnet is not installed completely: %s %s: %s", what, shim,
             strerror(err));
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)msg; *p; p++) {
        if (*p == '"' || *p == '\\')
            o += (size_t)sprintf(out + o, "\\%c", *p);
        else if (*p < 0x20)
            o += (size_t)sprintf(out + o, "\\u%04x", *p);
        else
            out[o++] = (char)*p;
    }
    out[o] = 0;
    printf("{\"cniVersion\": \"1.1.0\", \"code\": 5, \"msg\": \"%s\"}\n", out);
    fflush(stdout);
    _exit(1);
}

/* Hand the call to the Python shim: stdin re-supplied on fd 0, `failure` (if any) added. */
static _Noreturn void hand_off(const char *failure) {
    int fd = memfd_create("tenantnet-stdin", 0);
    if (fd < 0) /* memfd refused (a seccomp profile, say): an unnamed temporary file */
        fd = open("/tmp", O_TMPFILE | O_RDWR, 0600);
    if (fd < 0 || write_all(fd, in, in_len) < 0 || lseek(fd, 0, SEEK_SET) < 0 || dup2(fd, 0) < 0)
        no_shim("cannot give stdin to", errno);
    if (fd != 0)
        close(fd);
    size_t n = 0;
    while (environ[n])
        n++;
    char **envp = malloc((n + 2) * sizeof *envp);
    if (!envp)
        no_shim("out of memory to run", ENOMEM);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) /* drop an inherited FAILURE_ENV: only ours may count */
        if (strncmp(environ[i], FAILURE_ENV "=", sizeof FAILURE_ENV) != 0)
            envp[m++] = environ[i];
    if (failure) {
        size_t len = sizeof FAILURE_ENV + strlen(failure) + 1;
        char *entry = malloc(len);
        if (!entry)
            no_shim("out of memory to run", ENOMEM);
        snprintf(entry, len, "%s=%s", FAILURE_ENV, failure);
        envp[m++] = entry;
    }
    envp[m] = NULL;
    args[0] = shim;
    execve(shim, args, envp);
    no_shim("cannot run", errno);
}

/* The agent failed after we went to it: to the Python shim, which prints code 11. */
static _Noreturn void failed(const buf_t *sock, const char *fmt, const char *detail, double t) {
    char path[sizeof ((struct sockaddr_un *)0)->sun_path + PATH_MAX], reason[sizeof path + 512];
    size_t n = sock->len < sizeof path - 1 ? sock->len : sizeof path - 1;
    memcpy(path, sock->p, n);
    path[n] = 0;
    for (size_t i = 0; i < n; i++)
        if (!path[i]) /* an abstract socket's leading NUL cannot go into an env var */
            path[i] = '@';
    char ts[64];
    snprintf(ts, sizeof ts, "%g", t); /* Python's f"{timeout:g}" */
    snprintf(reason, sizeof reason, fmt, path, detail ? detail : ts);
    hand_off(reason);
}

/* What Python's str(OSError) would say: "(ConnectionResetError: [Errno 104] ...)". */
static const char *os_error(int err) {
    static char text[256];
    const char *kind = err == EPIPE ? "BrokenPipeError" : err == ECONNRESET ? "ConnectionResetError"
                     : err == ECONNABORTED ? "ConnectionAbortedError" : "OSError";
    snprintf(text, sizeof text, "%s: [Errno %d] %s", kind, err, strerror(err));
    return text;
}

#define WENT_AWAY "the tenantnet agent at %s went away before answering (%s)"
#define NO_ANSWER "the tenantnet agent at %s did not answer within %ss"

/* Receive exactly n bytes before the deadline; 0, or the reason it failed. */
static int recv_exact(int fd, char *p, size_t n, double deadline, const buf_t *sock, double t) {
    while (n) {
        ssize_t r = recv(fd, p, n, 0);
        if (r == 0)
            failed(sock, WENT_AWAY, "EOFError: connection closed", t);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN)
                failed(sock, WENT_AWAY, os_error(errno), t);
            if (!wait_for(fd, POLLIN, deadline))
                failed(sock, NO_ANSWER, NULL, t);
            continue;
        }
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

/* A decimal field up to the next NUL: 0 and *v set, or -1 (garbled). */
static int field(char **p, char *end, long long *v, int sign_ok) {
    char *nul = memchr(*p, 0, (size_t)(end - *p)), *s = *p;
    if (!nul)
        return -1;
    int neg = sign_ok && s < nul && *s == '-';
    s += neg;
    if (s == nul || nul - s > 12)
        return -1;
    long long x = 0;
    for (; s < nul; s++) {
        if ((unsigned)(*s - '0') > 9)
            return -1;
        x = x * 10 + (*s - '0');
    }
    *v = neg ? -x : x;
    *p = nul + 1;
    return 0;
}

int main(int argc, char **argv) {
    static char *no_args[2];
    args = argc > 0 ? argv : no_args; /* args[0] becomes the shim's path */
    /* Our name: argv[0] first (a symlink or copy named tenantnet-ipam), else the binary's. */
    char exe[PATH_MAX];
    ssize_t el = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (el <= 0) { /* no /proc: the directory argv[0] names */
        if (!argv[0] || !strchr(argv[0], '/') || strlen(argv[0]) >= sizeof exe)
            no_shim("cannot find (no /proc/self/exe)", errno);
        el = (ssize_t)strlen(argv[0]);
        memcpy(exe, argv[0], (size_t)el);
    }
    exe[el] = 0;
    static const char deleted[] = " (deleted)"; /* the link of a binary replaced meanwhile */
    if ((size_t)el > sizeof deleted && strcmp(exe + el - (sizeof deleted - 1), deleted) == 0)
        exe[el - (sizeof deleted - 1)] = 0;
    const char *name = argv[0] && is_plugin(basename_of(argv[0])) ? basename_of(argv[0]) : basename_of(exe);
    size_t dir = (size_t)(basename_of(exe) - exe);
    snprintf(shim, sizeof shim, "%.*s%s-shim", (int)dir, exe, name);

    buf_t b = {NULL, 0};
    if (read_bounded(0, MAX_STDIN + 1, &b) < 0 && errno == ENOMEM)
        no_shim("out of memory to read stdin for", ENOMEM);
    /* A closed fd 0 (EBADF) reads as empty, as the Python shim's sys.stdin None; another read
     * error ends the input there. */
    in = b.p;
    in_len = b.len;
    if (!is_plugin(name) || in_len > MAX_STDIN) /* the Python shim refuses it, as it always did */
        hand_off(NULL);

    buf_t sock = agent_socket();
    double timeout = timeout_of();
    size_t nenv;
    const char **env = env_entries(&nenv);
    if (!env)
        hand_off(NULL); /* nothing sent yet: the Python shim can do it all */

    /* The request, as shim.encode_request builds it, behind its 4-byte length. */
    double deadline = monotonic() + timeout; /* as shim.ask: when the connect starts */
    char head[128];
    int hl = snprintf(head, sizeof head, MAGIC "%c%s%c%lld%c%zu%c", 0, name, 0,
                      (long long)(deadline * 1000), 0, nenv, 0);
    size_t total = 4 + (size_t)hl + in_len;
    for (size_t i = 0; i < nenv; i++)
        total += strlen(env[i]) + 1;
    char *req = malloc(total);
    if (!req || total - 4 > UINT32_MAX)
        hand_off(NULL);
    uint32_t plen = (uint32_t)(total - 4);
    req[0] = (char)(plen >> 24), req[1] = (char)(plen >> 16), req[2] = (char)(plen >> 8), req[3] = (char)plen;
    char *w = req + 4;
    memcpy(w, head, (size_t)hl), w += hl;
    for (size_t i = 0; i < nenv; i++) {
        size_t l = strlen(env[i]) + 1; /* with its NUL: the separator */
        memcpy(w, env[i], l), w += l;
    }
    if (in_len)
        memcpy(w, in, in_len);

    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        hand_off(NULL);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    int abstract = sock.p[0] == 0; /* as CPython: a leading NUL is Linux's abstract namespace */
    if (sock.len + !abstract > sizeof sa.sun_path)
        failed(&sock, "cannot reach the tenantnet agent at %s: %s", "AF_UNIX path too long", timeout);
    memcpy(sa.sun_path, sock.p, sock.len);
    socklen_t salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + sock.len + !abstract);
    int err = 0;
    if (connect(fd, (struct sockaddr *)&sa, salen) < 0) {
        err = errno;
        if (err == EINPROGRESS || err == EINTR) {
            if (!wait_for(fd, POLLOUT, deadline))
                failed(&sock, "the tenantnet agent at %s did not accept the connection within %ss", NULL,
                       timeout);
            socklen_t el2 = sizeof err;
            if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el2) < 0)
                err = errno;
        }
    }
    if (err == ENOENT || err == ENOTDIR || err == ECONNREFUSED || err == EACCES) {
        close(fd);
        hand_off(NULL); /* shim._NO_AGENT: nobody serves this socket */
    }
    if (err) /* EAGAIN included: a full backlog refuses a non-blocking connect, as in Python */
        failed(&sock, "cannot reach the tenantnet agent at %s: %s", strerror(err), timeout);
    /* Who serves the socket (its uid at listen()): root or our own uid, as the agent demands
     * of its callers; anyone else gets nothing of the environment or stdin. */
    struct ucred peer;
    socklen_t pl = sizeof peer;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &pl) < 0 || (peer.uid != 0 && peer.uid != geteuid())) {
        close(fd);
        hand_off(NULL); /* shim.AgentUntrusted: the Python shim checks again, says so, runs in-process */
    }

    for (char *p = req; p < req + total;) {
        ssize_t s = send(fd, p, (size_t)(req + total - p), MSG_NOSIGNAL);
        if (s >= 0)
            p += s;
        else if (errno == EAGAIN) {
            if (!wait_for(fd, POLLOUT, deadline))
                failed(&sock, NO_ANSWER, NULL, timeout);
        } else if (errno != EINTR)
            failed(&sock, WENT_AWAY, os_error(errno), timeout);
    }

    /* The whole answer frame before a single byte is printed: never a partial stdout. */
    unsigned char len4[4];
    recv_exact(fd, (char *)len4, 4, deadline, &sock, timeout);
    uint32_t n = (uint32_t)len4[0] << 24 | (uint32_t)len4[1] << 16 | (uint32_t)len4[2] << 8 | len4[3];
    if (n > MAX_FRAME) {
        char why[96];
        snprintf(why, sizeof why, "ValueError: frame of %u bytes exceeds %d", n, MAX_FRAME);
        failed(&sock, WENT_AWAY, why, timeout);
    }
    char *resp = malloc(n ? n : 1);
    if (!resp)
        failed(&sock, WENT_AWAY, "MemoryError: no memory for the answer", timeout);
    recv_exact(fd, resp, n, deadline, &sock, timeout);
    close(fd);

    /* response = MAGIC NUL code NUL len(stdout) NUL stdout stderr */
    char *p = resp, *end = resp + n;
    long long code, outlen;
    if (n < sizeof MAGIC || memcmp(p, MAGIC, sizeof MAGIC) != 0) /* sizeof: with its NUL */
        failed(&sock, WENT_AWAY, "ValueError: not a tenantnet/1 answer", timeout);
    p += sizeof MAGIC;
    if (field(&p, end, &code, 1) < 0 || field(&p, end, &outlen, 0) < 0 || outlen > end - p)
        failed(&sock, WENT_AWAY, "ValueError: garbled answer frame", timeout);

    signal(SIGPIPE, SIG_IGN); /* a caller gone away: an error from write, not a signal */
    if (write_all(1, p, (size_t)outlen) < 0)
        _exit(1);
    write_all(2, p + outlen, (size_t)(end - p - outlen));
    /* shim.exit_status: the exit status is 8 bits, and 256 or -256 must not exit 0. */
    _exit(code >= 0 && code <= 255 ? (int)code : 1);
}
