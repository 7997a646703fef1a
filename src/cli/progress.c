/* A progress line on stderr for commands that run longer than a second:
 * "vramplan plan: 120 simulations, 7 s", rewritten once a second from a
 * SIGALRM handler (write(2) only, async-signal-safe) and erased at the
 * end. Shown only when stderr is a terminal; stdout is then fully
 * buffered until the end, so the report is not cut by the line.
 * VRAMPLAN_PROGRESS_MS sets the period in milliseconds (default 1000; 0
 * turns the line off). */
#define _POSIX_C_SOURCE 200809L
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#include "cli.h"

static char label[48];
static size_t label_len;
static volatile sig_atomic_t ticks, shown, active;
static long period_ms = 1000;
static char out_buf[1 << 16];

/* Decimal digits of v into p; returns the count. */
static size_t digits(char *p, uint64_t v)
{
    char t[24];
    size_t n = 0, k = 0;
    do
        t[n++] = (char)('0' + v % 10);
    while ((v /= 10) != 0);
    while (n)
        p[k++] = t[--n];
    return k;
}

static void tick(int sig)
{
    (void)sig;
    char line[160];
    size_t n = 0;
    ticks++;
    memcpy(line, "\r\033[K", 4);
    n += 4;
    memcpy(line + n, label, label_len);
    n += label_len;
    n += digits(line + n, vp_allocator_created());
    memcpy(line + n, " simulations, ", 14);
    n += 14;
    n += digits(line + n, (uint64_t)ticks * (uint64_t)period_ms / 1000);
    memcpy(line + n, " s", 2);
    n += 2;
    if (write(STDERR_FILENO, line, n) == (ssize_t)n)
        shown = 1;
}

void cli_progress_begin(const char *command)
{
    const char *env = getenv("VRAMPLAN_PROGRESS_MS");
    if (env && *env) {
        char *end;
        long v = strtol(env, &end, 10);
        if (*end == '\0' && v >= 0 && v <= 3600000)
            period_ms = v;
    }
    if (period_ms == 0 || !isatty(STDERR_FILENO))
        return;
    int n = snprintf(label, sizeof label, "vramplan %s: ", command);
    label_len = n > 0 && (size_t)n < sizeof label ? (size_t)n : 0;
    setvbuf(stdout, out_buf, _IOFBF, sizeof out_buf);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = tick;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    struct timeval tv = {period_ms / 1000, (period_ms % 1000) * 1000};
    struct itimerval it = {tv, tv};
    setitimer(ITIMER_REAL, &it, NULL);
    active = 1;
}

void cli_progress_end(void)
{
    if (!active)
        return;
    struct itimerval off;
    memset(&off, 0, sizeof off);
    setitimer(ITIMER_REAL, &off, NULL);
    signal(SIGALRM, SIG_IGN); /* a tick still on its way must not kill */
    active = 0;
    if (shown && write(STDERR_FILENO, "\r\033[K", 4) < 0)
        shown = 0; /* nothing more to do about a failed erase */
}
