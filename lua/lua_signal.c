/*
 * lua_signal.c — lucid.signal: a stop request by signal (SIGTERM from
 * `kill`, `timeout` or a job scheduler) for a long loop that checks it
 * between units of work (lucid.trainer: between training steps, validation
 * batches and epochs), so the loop stops on the same clean path as Ctrl-C
 * instead of the process dying wherever it was.
 *
 * Lua API:
 *   lucid.signal.catch(name) -> true | false
 *       name: "SIGTERM" (the signals lucid catches; another name is an
 *       argument error listing them). Replaces the DEFAULT disposition by a
 *       handler that only records the signal (volatile sig_atomic_t flags).
 *       A second signal at least 2 s after the first gets the default
 *       action (the handler puts it back with sigaction and re-raises: it
 *       kills, as a second Ctrl-C does); one sooner is the same request
 *       delivered twice and is ignored — GNU timeout(1) sends its signal to
 *       the child and then to its own process group, which holds the child,
 *       so the child receives it twice within microseconds (a fresh-user
 *       tryout saw 2 of 14 `timeout` runs die without the message when the
 *       second delivery killed them). sigaction, raise and clock_gettime are
 *       async-signal-safe (POSIX.1-2008, signal-safety(7)). A disposition that is not the default (SIG_IGN, e.g. under
 *       nohup-like launchers, or a host application's own handler) is left
 *       as it is and catch returns false: nothing will be recorded. Catches
 *       nest (one release each); the outermost one clears what was recorded.
 *   lucid.signal.release(name)
 *       undoes one catch; the last one puts back the disposition the
 *       outermost catch found and forgets what was recorded. A release
 *       without a catch is an error.
 *   lucid.signal.caught() -> name, number | nil
 *       the first signal recorded since the outermost catch ("SIGTERM",
 *       15), or nil; reading does not clear it (the outermost release
 *       does, so a stop request never outlives the loop it was for).
 * The state is process-wide (signal dispositions are); call these from the
 * thread of one Lua state. The handler may run on any thread (the loader
 * and checkpoint-writer threads included): it writes one flag and returns.
 * Errors: a failing sigaction raises "lucid.signal.catch: sigaction(SIGTERM):
 * <strerror>" (nothing is printed from C).
 */
#include "lua_common.h"

#include <errno.h>
#include <signal.h>
#include <string.h>
#include <time.h>

/* One catchable signal: its name, number, nesting depth, whether lucid's
 * handler is installed, and the disposition it replaced. */
typedef struct stop_signal {
    const char *name;
    int sig;
    int depth;
    int installed;
    struct sigaction saved;
} stop_signal;

static stop_signal signals_[] = {
    {.name = "SIGTERM", .sig = SIGTERM},
};
#define NSIGNALS ((int)(sizeof signals_ / sizeof signals_[0]))

/* The first recorded signal number (0: none) and when it came (seconds of
 * CLOCK_MONOTONIC). Written by the handler only. */
static volatile sig_atomic_t caught_sig = 0;
static volatile sig_atomic_t caught_at = 0;

#define STOP_REPEAT_S 2 /* a repeat sooner than this is one request delivered twice */

static sig_atomic_t now_s(void) {
    struct timespec t;
    if (clock_gettime(CLOCK_MONOTONIC, &t) != 0) return 0;
    return (sig_atomic_t)(t.tv_sec & 0x3fffffff);
}

/* Async-signal-safe (clock_gettime, sigaction, raise): the first signal is
 * recorded; a repeat within STOP_REPEAT_S is ignored; a later one restores
 * the default action and re-raises the signal (it kills). */
static void on_stop_signal(int sig) {
    if (caught_sig == 0) {
        caught_at = now_s();
        caught_sig = sig;
        return;
    }
    if (now_s() - caught_at < STOP_REPEAT_S) return;
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, NULL);
    raise(sig);
}

/* Sum of the depths: 0 when no catch is active. */
static int total_depth(void) {
    int n = 0;
    for (int i = 0; i < NSIGNALS; i++) n += signals_[i].depth;
    return n;
}

/* The signal named by argument 1; raises an argument error listing the
 * names lucid catches. */
static stop_signal *check_signal(lua_State *L) {
    const char *name = lucid_lua_checkstring(L, 1);
    for (int i = 0; i < NSIGNALS; i++)
        if (strcmp(name, signals_[i].name) == 0) return &signals_[i];
    lucid_lua_argerror(
        L, 1, lua_pushfstring(L, "name: expected SIGTERM, got '%s'", name));
    return NULL;
}

/* Raise "<fn>: sigaction(<name>): <strerror(e)>" (a failed sigaction). */
static int sigaction_error(lua_State *L, const stop_signal *s, int e) {
    const char *fn = lucid_lua_function_name(L);
    return luaL_error(L, "%s: sigaction(%s): %s", fn, s->name, strerror(e));
}

/* lucid.signal.catch(name) -> true when lucid's handler records the signal,
 * false when its disposition was not the default and is left as it was. */
static int l_catch(lua_State *L) {
    lucid_lua_check_nargs(L, 1);
    stop_signal *s = check_signal(L);
    if (s->depth > 0) {
        s->depth++;
        lua_pushboolean(L, s->installed);
        return 1;
    }
    struct sigaction old;
    if (sigaction(s->sig, NULL, &old) != 0) {
        return sigaction_error(L, s, errno);
    }
    if (total_depth() == 0) caught_sig = 0;
    s->installed = 0;
    if (old.sa_handler == SIG_DFL && !(old.sa_flags & SA_SIGINFO)) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_stop_signal;
        sigemptyset(&sa.sa_mask);
        /* SA_RESTART: a read/write in progress goes on; a second signal
         * is on_stop_signal's (ignored, or the default action) */
        sa.sa_flags = SA_RESTART;
        if (sigaction(s->sig, &sa, &s->saved) != 0) {
            return sigaction_error(L, s, errno);
        }
        s->installed = 1;
    }
    s->depth = 1;
    lua_pushboolean(L, s->installed);
    return 1;
}

/* lucid.signal.release(name): undo one catch; the last restores the
 * disposition the outermost catch replaced and clears the record. */
static int l_release(lua_State *L) {
    lucid_lua_check_nargs(L, 1);
    stop_signal *s = check_signal(L);
    if (s->depth == 0)
        return lucid_lua_argerror(
            L, 1, lua_pushfstring(L, "name: %s is not caught (release without a catch)",
                                  s->name));
    if (--s->depth > 0) return 0;
    if (s->installed) {
        s->installed = 0;
        if (sigaction(s->sig, &s->saved, NULL) != 0) return sigaction_error(L, s, errno);
    }
    /* the handler is gone: nothing writes the flag any more */
    if (total_depth() == 0) caught_sig = 0;
    return 0;
}

/* lucid.signal.caught() -> name, number of the first recorded signal, or
 * nil. */
static int l_caught(lua_State *L) {
    lucid_lua_check_nargs(L, 0);
    int sig = caught_sig;
    for (int i = 0; i < NSIGNALS && sig; i++) {
        if (signals_[i].sig == sig) {
            lua_pushstring(L, signals_[i].name);
            lua_pushinteger(L, sig);
            return 2;
        }
    }
    lua_pushnil(L);
    return 1;
}

/* Adds lucid.signal to the module table at the top of the stack. */
int lucid_lua_open_signal(lua_State *L) {
    static const luaL_Reg fns[] = {
        {"catch", l_catch}, {"release", l_release}, {"caught", l_caught}, {NULL, NULL}};
    lua_newtable(L);
    for (const luaL_Reg *r = fns; r->name; r++) {
        lua_pushcfunction(L, r->func);
        lua_setfield(L, -2, r->name);
    }
    lua_setfield(L, -2, "signal");
    return 0;
}
