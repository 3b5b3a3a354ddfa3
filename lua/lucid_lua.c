/*
 * lucid_lua.c — luaopen_lucid, the entry point of the Lua module.
 *
 * `local lucid = require "lucid"` returns a new table and sets no globals
 * (style_anchors Absorb 16, Avoid 5): the metatables go to the registry, the
 * default context of the lua_State lives in the registry too. Opening also
 * prepends <root>/lua/?.lua;<root>/lua/?/init.lua to package.path, where
 * <root> is the directory of the object that holds luaopen_lucid (lucid.so,
 * or the host executable's parent directory for bin/lucid), so the Lua
 * library (require "lucid.trainer", ...) is found from any working dir.
 */
#include "lua_common.h"

#include <dlfcn.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int luaopen_lucid(lua_State *L);

/* Bindings written alongside this one (lua/lua_data.c, lua/lua_nn.c) are
 * optional at link time: weak references are NULL when absent. */
__attribute__((weak)) int lucid_lua_open_data(lua_State *L);
__attribute__((weak)) int lucid_lua_open_nn(lua_State *L);
__attribute__((weak)) int lucid_lua_open_optim(lua_State *L);
__attribute__((weak)) int lucid_lua_open_image(lua_State *L);
__attribute__((weak)) int lucid_lua_open_predict(lua_State *L);
__attribute__((weak)) int lucid_lua_open_graph(lua_State *L);
__attribute__((weak)) int lucid_lua_open_input(lua_State *L);
__attribute__((weak)) int lucid_lua_open_hash(lua_State *L);
__attribute__((weak)) int lucid_lua_open_signal(lua_State *L);
int lucid_lua_open_loss(lua_State *L);
int lucid_lua_open_eval(lua_State *L);

static int is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Root of the Lua library: the first of dir, dir/.., dir/../.. (dir = the
 * directory of the object holding luaopen_lucid) that has lua/lucid/. Fills
 * root and returns 1, or 0 when it cannot be found. */
static int find_root(char *root, size_t n) {
    Dl_info info;
    char path[PATH_MAX], real[PATH_MAX];
    path[0] = '\0';
    if (dladdr((void *)luaopen_lucid, &info) && info.dli_fname &&
        strchr(info.dli_fname, '/'))
        snprintf(path, sizeof path, "%s", info.dli_fname);
    if (!path[0] || !realpath(path, real)) {
        /* the main program: dladdr may give argv[0] without a directory */
        ssize_t k = readlink("/proc/self/exe", real, sizeof real - 1);
        if (k <= 0) return 0;
        real[k] = '\0';
    }
    char *slash = strrchr(real, '/');
    if (!slash) return 0;
    *slash = '\0';
    for (int up = 0; up < 3; up++) {
        char probe[PATH_MAX + 16];
        snprintf(probe, sizeof probe, "%s/lua/lucid", real);
        if (is_dir(probe)) {
            snprintf(root, n, "%s", real);
            return 1;
        }
        slash = strrchr(real, '/');
        if (!slash || slash == real) break;
        *slash = '\0';
    }
    return 0;
}

/* Prepend root's Lua library to package.path (once per lua_State). */
static void add_package_path(lua_State *L) {
    char root[PATH_MAX];
    if (!find_root(root, sizeof root)) return;
    lua_getglobal(L, "package");
    if (!lua_istable(L, -1)) {
        lua_pop(L, 1);
        return;
    }
    lua_getfield(L, -1, "path");
    const char *old = lua_isstring(L, -1) ? lua_tostring(L, -1) : "";
    lua_pushfstring(L, "%s/lua/?.lua;%s/lua/?/init.lua;", root, root);
    const char *prefix = lua_tostring(L, -1);
    if (strstr(old, prefix) == NULL) {
        lua_pushstring(L, old);
        lua_concat(L, 2);
        lua_setfield(L, -3, "path");
        lua_pop(L, 2);
    } else {
        lua_pop(L, 3);
    }
}

/* lucid.wall_time() -> seconds (monotonic clock, sub-microsecond
 * resolution): for timing training phases and progress rates. */
static int l_wall_time(lua_State *L) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    lua_pushnumber(L, (lua_Number)ts.tv_sec + 1e-9 * (lua_Number)ts.tv_nsec);
    return 1;
}

/* lucid.cpu_count() -> n >= 1: the online CPUs (sysconf
 * _SC_NPROCESSORS_ONLN; 1 when unknown), for sizing worker threads as
 * Ultralytics does (min(os.cpu_count(), workers)). */
static int l_cpu_count(lua_State *L) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    lua_pushinteger(L, n > 0 ? (lua_Integer)n : 1);
    return 1;
}

/* A file-size limit (ulimit -f) sends SIGXFSZ, whose default action kills
 * the process with no message, leaving a checkpoint's temporary file behind.
 * Ignored (as CPython does at startup), the write fails with EFBIG instead
 * and the checkpoint writer reports it, naming the file, with the previous
 * checkpoint kept.  Only a default disposition is changed: a host
 * application's own handler stays. */
static void ignore_sigxfsz(void) {
    struct sigaction old;
    if (sigaction(SIGXFSZ, NULL, &old) == 0 && old.sa_handler == SIG_DFL &&
        !(old.sa_flags & SA_SIGINFO)) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = SIG_IGN;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGXFSZ, &sa, NULL);
    }
}

/* lucid.Step(o): the capturable training step (lua/lucid/recorded_step.lua's
 * new, docs/STEP.md): the Trainer's step, usable from a recipe or the REPL.
 * A Lua function that requires the module on its first call, so require
 * "lucid" stays light and the Lua library (which requires "lucid") is not
 * loaded before this module exists. */
static const char step_src[] =
    "local rs\n"
    "return function(o)\n"
    "  rs = rs or require('lucid.recorded_step')\n"
    "  return rs.new(o)\n"
    "end\n";

static void add_step(lua_State *L) {
    if (luaL_loadbuffer(L, step_src, sizeof step_src - 1, "=lucid.Step") != 0 ||
        lua_pcall(L, 0, 1, 0) != 0) {
        lua_pop(L, 1); /* the message: a build without the Lua library has no Step */
        return;
    }
    lua_setfield(L, -2, "Step");
}

int luaopen_lucid(lua_State *L) {
    ignore_sigxfsz();
    lua_newtable(L);
    lua_pushcfunction(L, l_wall_time);
    lua_setfield(L, -2, "wall_time");
    lua_pushcfunction(L, l_cpu_count);
    lua_setfield(L, -2, "cpu_count");
    lua_pushliteral(L, LUCID_VERSION);
    lua_setfield(L, -2, "version");
    lucid_lua_open_tensor(L);
    lucid_lua_open_context(L);
    if (lucid_lua_open_nn) lucid_lua_open_nn(L);
    if (lucid_lua_open_data) lucid_lua_open_data(L);
    if (lucid_lua_open_optim) lucid_lua_open_optim(L);
    lucid_lua_open_loss(L);
    lucid_lua_open_eval(L);
    if (lucid_lua_open_image) lucid_lua_open_image(L);
    if (lucid_lua_open_predict) lucid_lua_open_predict(L);
    if (lucid_lua_open_graph) lucid_lua_open_graph(L);
    if (lucid_lua_open_input) lucid_lua_open_input(L);
    if (lucid_lua_open_hash) lucid_lua_open_hash(L);
    if (lucid_lua_open_signal) lucid_lua_open_signal(L);
    add_package_path(L);
    add_step(L);
    lucid_lua_set_module(L, -1); /* argument errors name its functions */
    return 1;
}
