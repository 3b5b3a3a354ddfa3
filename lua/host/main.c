/*
 * main.c — bin/lucid, a small host program that embeds LuaJIT and the
 * engine through the Lua C API.
 *
 *   bin/lucid script.lua [args...]   run a script the way luajit does: the
 *                                    global `arg` holds the arguments
 *                                    (arg[0] = script, arg[-1] = program),
 *                                    the chunk gets them as `...`
 *   bin/lucid -e 'code' [args...]    run a string, with `lucid` loaded
 *   bin/lucid -                      run stdin as a script
 *   bin/lucid                        interactive prompt with `lucid` loaded
 *   bin/lucid -v                     print the version
 *   bin/lucid -h | --help            print the usage (exit status 0; a
 *                                    usage error prints it to stderr, 2)
 *
 * `require "lucid"` resolves to the module linked into this program
 * (package.preload), so no lucid.so is needed next to it. The code typed
 * on the command line (-e) and at the prompt finds the global `lucid`
 * already loaded; script files get no globals (they `local lucid = require
 * "lucid"`, so they run the same under luajit). Errors print the
 * message and a traceback to stderr and the exit status is 1. Ctrl-C
 * interrupts a running chunk with an "interrupted!" error (as lua.c does).
 */
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <luajit.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lucid.h"

int luaopen_lucid(lua_State *L);

static const char *progname = "lucid";
static lua_State *global_L; /* only for the SIGINT handler */

/* ------------------------------------------------------------ interrupts */

static void stop_hook(lua_State *L, lua_Debug *ar) {
    (void)ar;
    lua_sethook(L, NULL, 0, 0);
    luaL_error(L, "interrupted!");
}

static void on_sigint(int sig) {
    signal(sig, SIG_DFL); /* a second Ctrl-C kills the process */
    lua_sethook(global_L, stop_hook,
                LUA_MASKCALL | LUA_MASKRET | LUA_MASKCOUNT, 1);
}

/* ----------------------------------------------------------------- calls */

/* Message handler: the error plus a traceback. */
static int traceback(lua_State *L) {
    const char *msg = lua_tostring(L, 1);
    if (!msg) {
        if (luaL_callmeta(L, 1, "__tostring") && lua_isstring(L, -1)) return 1;
        msg = lua_pushfstring(L, "(error object is a %s value)",
                              luaL_typename(L, 1));
    }
    luaL_traceback(L, L, msg, 1);
    return 1;
}

/* Call the function below nargs arguments on the stack with a traceback
 * handler; prints an error; returns the status. */
static int docall(lua_State *L, int nargs, int nres) {
    int base = lua_gettop(L) - nargs;
    lua_pushcfunction(L, traceback);
    lua_insert(L, base);
    global_L = L;
    signal(SIGINT, on_sigint);
    int status = lua_pcall(L, nargs, nres, base);
    signal(SIGINT, SIG_DFL);
    lua_remove(L, base);
    return status;
}

static int report(lua_State *L, int status) {
    if (status && !lua_isnil(L, -1)) {
        const char *msg = lua_tostring(L, -1);
        fprintf(stderr, "%s: %s\n", progname, msg ? msg : "(error object)");
        fflush(stderr);
        lua_pop(L, 1);
    }
    return status;
}

/* The global `arg` table: arg[-1] = program, arg[0] = script, then args. */
static void set_arg_table(lua_State *L, char **argv, int argc, int script) {
    lua_createtable(L, argc - script - 1, script + 1);
    for (int i = 0; i < argc; i++) {
        lua_pushstring(L, argv[i]);
        lua_rawseti(L, -2, i - script);
    }
    lua_setglobal(L, "arg");
}

/* Push argv[first..argc) as chunk arguments; returns their count. */
static int push_args(lua_State *L, char **argv, int argc, int first) {
    luaL_checkstack(L, argc - first + 3, "too many arguments to script");
    for (int i = first; i < argc; i++) lua_pushstring(L, argv[i]);
    return argc - first;
}

/* The convenience global of typed code (-e and the prompt): `lucid` =
 * require "lucid". Returns the status (the error reported). */
static int load_lucid_global(lua_State *L) {
    lua_getglobal(L, "require");
    lua_pushliteral(L, "lucid");
    int status = report(L, docall(L, 1, 1));
    if (status == 0) lua_setglobal(L, "lucid");
    return status;
}

/* ------------------------------------------------------------------- REPL */

/* Print the values on the stack above base (the REPL's expression result). */
static void print_results(lua_State *L, int base) {
    int n = lua_gettop(L) - base;
    if (n <= 0) return;
    lua_getglobal(L, "print");
    lua_insert(L, base + 1);
    if (docall(L, n, 0) != 0) report(L, 1);
}

/* 1 when a syntax error means the chunk is incomplete (more lines needed). */
static int incomplete(lua_State *L, int status) {
    if (status != LUA_ERRSYNTAX) return 0;
    size_t len;
    const char *msg = lua_tolstring(L, -1, &len);
    static const char eof[] = "'<eof>'";
    size_t k = sizeof eof - 1;
    if (len >= k && strcmp(msg + len - k, eof) == 0) {
        lua_pop(L, 1);
        return 1;
    }
    return 0;
}

/* Read one line (without the newline) into buf; 0 at end of input. */
static int read_line(const char *prompt, int tty, char *buf, size_t n) {
    if (tty) {
        fputs(prompt, stdout);
        fflush(stdout);
    }
    if (!fgets(buf, (int)n, stdin)) return 0;
    size_t l = strlen(buf);
    if (l && buf[l - 1] == '\n') buf[l - 1] = '\0';
    return 1;
}

/* Interactive prompt. Each line is tried as "return <line>" first (so
 * expressions print their value), then as a statement; an incomplete
 * statement asks for more lines. Returns 1 when a chunk failed and the
 * input is not a terminal (so piped sessions report errors in the exit
 * status), else 0. */
static int repl(lua_State *L) {
    int tty = isatty(fileno(stdin));
    int failed = 0;
    char line[8192];
    /* typed code gets the convenience global `lucid` (as -e does); script
     * files get no globals; they `local lucid = require "lucid"` */
    load_lucid_global(L);
    if (tty)
        printf("lucid %s (LuaJIT) - `lucid` is loaded; Ctrl-D exits\n",
               LUCID_VERSION);
    while (read_line("> ", tty, line, sizeof line)) {
        int base = lua_gettop(L);
        lua_pushfstring(L, "return %s", line);
        size_t len;
        const char *code = lua_tolstring(L, -1, &len);
        int status = luaL_loadbuffer(L, code, len, "=stdin");
        lua_remove(L, -2);
        if (status != 0) {
            lua_pop(L, 1);
            /* as a statement, reading more lines while incomplete */
            lua_pushstring(L, line);
            for (;;) {
                code = lua_tolstring(L, -1, &len);
                status = luaL_loadbuffer(L, code, len, "=stdin");
                if (!incomplete(L, status)) break;
                char more[8192];
                if (!read_line(">> ", tty, more, sizeof more)) {
                    status = luaL_loadbuffer(L, code, len, "=stdin");
                    break;
                }
                lua_pushliteral(L, "\n");
                lua_pushstring(L, more);
                lua_concat(L, 3);
            }
            lua_remove(L, -2); /* the source text */
        }
        if (status == 0) status = docall(L, 0, LUA_MULTRET);
        if (status == 0)
            print_results(L, base);
        else {
            report(L, status);
            failed = 1;
        }
        lua_settop(L, base);
    }
    if (tty) fputs("\n", stdout);
    return failed && !tty;
}

/* ------------------------------------------------------------------- main */

/* The usage text to out. For --help/-h (out = stdout, status 0) and for a
 * usage error (out = stderr, status 2: an unknown flag, -e without code). */
static int usage(FILE *out, int status) {
    fprintf(out,
            "usage: %s [script.lua [args...] | -e code [args...] | - | -v | -h]\n"
            "  script.lua [args...]  run a script as luajit does (arg, ...)\n"
            "  -e code [args...]     run a string, with `lucid` loaded\n"
            "  -                     run stdin as a script\n"
            "  -v, --version         print the version\n"
            "  -h, --help            print this help\n"
            "  with no argument: interactive prompt with `lucid` loaded\n"
            "  a recipe lists its settings with --help: %s recipes/pose_nano.lua --help\n",
            progname, progname);
    return status;
}

/* Everything that runs Lua, inside a protected call. */
typedef struct host_args {
    int argc;
    char **argv;
    int rc;
} host_args;

static int pmain(lua_State *L) {
    host_args *h = lua_touserdata(L, 1);
    char **argv = h->argv;
    int argc = h->argc;
    lua_settop(L, 0);
    luaL_openlibs(L);
    /* require "lucid" -> the module linked into this program */
    lua_getglobal(L, "package");
    lua_getfield(L, -1, "preload");
    lua_pushcfunction(L, luaopen_lucid);
    lua_setfield(L, -2, "lucid");
    lua_pop(L, 2);

    if (argc < 2) {
        h->rc = repl(L);
        return 0;
    }
    const char *a = argv[1];
    int status;
    if (strcmp(a, "-v") == 0 || strcmp(a, "--version") == 0) {
        printf("lucid %s (%s)\n", LUCID_VERSION, LUAJIT_VERSION);
        h->rc = 0;
        return 0;
    }
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
        h->rc = usage(stdout, 0);
        return 0;
    }
    if (strcmp(a, "-e") == 0) {
        if (argc < 3) {
            h->rc = usage(stderr, 2);
            return 0;
        }
        set_arg_table(L, argv, argc, 2);
        /* `lucid` loaded, as at the prompt */
        if (load_lucid_global(L) != 0) {
            h->rc = 1;
            return 0;
        }
        status = luaL_loadbuffer(L, argv[2], strlen(argv[2]), "=(command line)");
        if (status == 0) status = docall(L, push_args(L, argv, argc, 3), 0);
    } else if (a[0] == '-' && a[1] != '\0') {
        h->rc = usage(stderr, 2);
        return 0;
    } else {
        int stdin_script = strcmp(a, "-") == 0;
        set_arg_table(L, argv, argc, 1);
        status = luaL_loadfile(L, stdin_script ? NULL : a);
        if (status == 0) status = docall(L, push_args(L, argv, argc, 2), 0);
    }
    h->rc = report(L, status) ? 1 : 0;
    return 0;
}

int main(int argc, char **argv) {
    if (argv[0] && argv[0][0]) progname = argv[0];
    lua_State *L = luaL_newstate();
    if (!L) {
        fprintf(stderr, "%s: cannot create the Lua state (out of memory)\n",
                progname);
        return 1;
    }
    host_args h = {argc, argv, 1};
    lua_pushcfunction(L, pmain);
    lua_pushlightuserdata(L, &h);
    int status = lua_pcall(L, 1, 0, 0);
    if (status != 0) {
        const char *msg = lua_tostring(L, -1);
        fprintf(stderr, "%s: %s\n", progname, msg ? msg : "(error object)");
        h.rc = 1;
    }
    lua_close(L);
    return h.rc;
}
