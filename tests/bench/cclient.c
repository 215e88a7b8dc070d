/* cclient: the bare client's work in C, one thread, for the bench (tests/bench/fastmock.py builds it).

   cclient HOST PORT RATE_PER_S DURATION_S TOKENS OUT.json [SEED]

Why: the bare uvloop client (bare_client.py) is the least a Python client can do; this is the least any client
can do on one core (epoll, a timerfd at the next send, one clock read per read), so bench_fast can show what
compiled code would gain over Python's event loop (issue 29 part 3), measured rather than assumed.
Same contract as bare_client.py: Poisson arrivals (its own generator, seeded), kept-alive HTTP/1.1 connections
(an idle one is reused, else a new one is opened: no pool limit), POST /v1/completions with max_tokens TOKENS,
a read stamped with CLOCK_MONOTONIC as it lands, the end found by the chunked body's last chunk. Writes
{"cpu_s", "requests": [{"request_id", "intended_ns", "sent_ns", "read_ns", "chunks"}]} (chunks: the `"text":`
keys each read holds), as bare_client.py does. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#define MAX_READS 256

typedef struct {
    int64_t intended, sent;
    int n_reads, done;
    int64_t t[MAX_READS];
    int chunks[MAX_READS];
} Req;

typedef struct { int fd, req, connecting; char tail[8]; int tail_len; } Conn;  /* tail: the last bytes read */

static Req *reqs;
static Conn *conns; static int n_conns, cap_conns;
static int *idle; static int n_idle;
static int ep;
static struct sockaddr_in addr;
static char body[512]; static int body_len;

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void send_request(int c) {
    char buf[1024];
    int n = snprintf(buf, sizeof buf, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     "X-Request-Id: c-%06d\r\nContent-Length: %d\r\n\r\n%s", conns[c].req, body_len, body);
    if (write(conns[c].fd, buf, (size_t)n) != n) { perror("write"); exit(1); }
    reqs[conns[c].req].sent = now_ns();
}

static void dispatch(int r) {
    int c;
    if (n_idle) {
        c = idle[--n_idle];
    } else {
        if (n_conns == cap_conns) {
            cap_conns = cap_conns ? 2 * cap_conns : 256;
            conns = realloc(conns, (size_t)cap_conns * sizeof *conns);
            idle = realloc(idle, (size_t)cap_conns * sizeof *idle);
        }
        c = n_conns++;
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0), one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        conns[c] = (Conn){.fd = fd, .req = -1};
        int rc = connect(fd, (struct sockaddr *)&addr, sizeof addr);
        struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t)c};
        if (rc < 0 && errno == EINPROGRESS) { ev.events |= EPOLLOUT; conns[c].connecting = 1; }
        else if (rc < 0) { perror("connect"); exit(1); }
        epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
    }
    conns[c].req = r;
    conns[c].tail_len = 0;
    if (!conns[c].connecting) send_request(c);
}

static int count_text(const char *p, size_t n) {
    int k = 0;
    for (const char *q = p; (q = memmem(q, (size_t)(p + n - q), "\"text\":", 7)); q += 7) k++;
    return k;
}

static void on_read(int c) {
    char buf[65536];
    for (;;) {
        ssize_t n = read(conns[c].fd, buf, sizeof buf);
        if (n <= 0) {
            if (n < 0 && errno == EAGAIN) return;
            fprintf(stderr, "connection %d closed\n", c);
            exit(1);
        }
        int64_t t = now_ns();
        Req *q = &reqs[conns[c].req];
        if (q->n_reads < MAX_READS) { q->t[q->n_reads] = t; q->chunks[q->n_reads] = count_text(buf, (size_t)n); q->n_reads++; }
        /* the end: the last 5 bytes of the stream so far are the last chunk (a read may split them) */
        Conn *cn = &conns[c];
        size_t keep = n >= 5 ? 5 : (size_t)n;
        if (n >= 5) cn->tail_len = 0;
        else if (cn->tail_len + keep > 5) { memmove(cn->tail, cn->tail + cn->tail_len + keep - 5, 5 - keep); cn->tail_len = 5 - (int)keep; }
        memcpy(cn->tail + cn->tail_len, buf + n - keep, keep);
        cn->tail_len += (int)keep;
        if (cn->tail_len == 5 && !memcmp(cn->tail, "0\r\n\r\n", 5)) {
            q->done = 1;
            cn->req = -1;
            idle[n_idle++] = c;
            return;
        }
    }
}

int main(int argc, char **argv) {
    if (argc < 7) { fprintf(stderr, "usage: cclient HOST PORT RATE_PER_S DURATION_S TOKENS OUT.json [SEED]\n"); return 2; }
    double rate = atof(argv[3]), dur = atof(argv[4]);
    int tokens = atoi(argv[5]);
    uint64_t s = argc > 7 ? strtoull(argv[7], NULL, 10) : 1;
    addr = (struct sockaddr_in){.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[2]))};
    inet_pton(AF_INET, argv[1], &addr.sin_addr);
    body_len = snprintf(body, sizeof body, "{\"model\":\"m\",\"prompt\":\"tok tok tok tok tok tok tok tok tok tok tok tok "
                        "tok tok tok tok \",\"max_tokens\":%d,\"stream\":true,\"stream_options\":{\"include_usage\":true}}", tokens);
    int n = (int)(rate * dur);
    reqs = calloc((size_t)n, sizeof *reqs);
    prctl(PR_SET_TIMERSLACK, 1UL);
    ep = epoll_create1(0);
    int tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK);
    struct epoll_event tev = {.events = EPOLLIN, .data.u32 = UINT32_MAX};
    epoll_ctl(ep, EPOLL_CTL_ADD, tfd, &tev);
    int64_t t0 = now_ns() + 100000000LL, off = 0;
    for (int i = 0; i < n; i++) {  /* exponential gaps: splitmix64 -> uniform (0, 1] -> -ln(u) / rate */
        s += 0x9E3779B97F4A7C15ULL;
        uint64_t z = s; z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL; z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL; z ^= z >> 31;
        double u = ((double)(z >> 11) + 1.0) / 9007199254740992.0;
        off += (int64_t)(-log(u) / rate * 1e9);
        reqs[i].intended = t0 + off;
    }
    struct rusage r0, r1;
    getrusage(RUSAGE_SELF, &r0);
    int next = 0, finished = 0;
    int64_t give_up = reqs[n - 1].intended + 30000000000LL;
    struct epoll_event evs[256];
    while (finished < n && now_ns() < give_up) {
        if (next < n) {
            struct itimerspec its = {.it_value = {.tv_sec = reqs[next].intended / 1000000000LL,
                                                  .tv_nsec = reqs[next].intended % 1000000000LL}};
            timerfd_settime(tfd, TFD_TIMER_ABSTIME, &its, NULL);
        }
        int k = epoll_wait(ep, evs, 256, 1000);
        for (int e = 0; e < k; e++) {
            uint32_t c = evs[e].data.u32;
            if (c == UINT32_MAX) { uint64_t x; if (read(tfd, &x, sizeof x) < 0) { /* spurious */ } continue; }
            if (conns[c].connecting && (evs[e].events & EPOLLOUT)) {
                conns[c].connecting = 0;
                struct epoll_event ev = {.events = EPOLLIN, .data.u32 = c};
                epoll_ctl(ep, EPOLL_CTL_MOD, conns[c].fd, &ev);
                send_request((int)c);
            }
            if (evs[e].events & EPOLLIN && conns[c].req >= 0) {
                on_read((int)c);
                if (conns[c].req < 0) finished++;
            }
        }
        int64_t t = now_ns();
        while (next < n && reqs[next].intended <= t) dispatch(next++);
    }
    getrusage(RUSAGE_SELF, &r1);
    double cpu = (double)(r1.ru_utime.tv_sec - r0.ru_utime.tv_sec) + (r1.ru_utime.tv_usec - r0.ru_utime.tv_usec) / 1e6
               + (double)(r1.ru_stime.tv_sec - r0.ru_stime.tv_sec) + (r1.ru_stime.tv_usec - r0.ru_stime.tv_usec) / 1e6;
    FILE *f = fopen(argv[6], "w");
    if (!f) { perror(argv[6]); return 1; }
    fprintf(f, "{\"cpu_s\":%.6f,\"requests\":[", cpu);
    for (int i = 0; i < n; i++) {
        Req *q = &reqs[i];
        fprintf(f, "%s{\"request_id\":\"c-%06d\",\"intended_ns\":%lld,\"sent_ns\":%lld,\"read_ns\":[", i ? "," : "", i,
                (long long)q->intended, (long long)q->sent);
        for (int j = 0; j < q->n_reads; j++) fprintf(f, j ? ",%lld" : "%lld", (long long)q->t[j]);
        fputs("],\"chunks\":[", f);
        for (int j = 0; j < q->n_reads; j++) fprintf(f, j ? ",%d" : "%d", q->chunks[j]);
        fputs("]}", f);
    }
    fputs("]}\n", f);
    fclose(f);
    return finished == n ? 0 : 3;
}
