/*
 * yaml.c — reading an Ultralytics data YAML with libyaml.
 *
 * Contract
 *   - Keys read: path, train, val (a string each), kpt_shape ([K, D]),
 *     flip_idx ([K ints]), names (a mapping id -> name with the ids
 *     0..n-1 in any order, or a list), nc. Other keys are ignored (a data
 *     YAML carries test splits, kpt_names, download scripts, ...).
 *   - path, train and val are returned as written, with the YAML's folder
 *     in `dir`: resolving them (Ultralytics check_det_dataset: path
 *     relative to the working directory or the datasets folder, train/val
 *     relative to path) needs the datasets folders, which the caller knows
 *     (lua/lucid/data.lua).
 *   - names absent: class_0 .. class_{nc-1} (Ultralytics).
 *   - Errors are ERR_FORMAT "<file>:<line>: <key> ..." (ERR_IO when
 *     unreadable).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "data.h"
#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

void lucid_data_yaml_free(lucid_data_yaml *y) {
    if (!y) return;
    free(y->dir);
    free(y->path);
    free(y->train);
    free(y->val);
    if (y->names)
        for (int i = 0; i < y->nc; i++) free(y->names[i]);
    free(y->names);
    memset(y, 0, sizeof *y);
}

static const char *scalar(yaml_node_t *n) {
    return n && n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value
                                            : NULL;
}

static int parse_int(const char *s, int *out) {
    if (!s) return -1;
    char *e;
    long v = strtol(s, &e, 10);
    if (e == s || *e) return -1;
    *out = (int)v;
    return 0;
}

/* The value of node n as written, for an error message: a scalar's text,
 * a sequence as [a, b, ...] of its scalars (nested or long ones shortened
 * with "..."), a mapping as {...}; at most `size` bytes with the NUL. */
static void node_text(yaml_document_t *doc, yaml_node_t *n, char *buf, size_t size) {
    if (!size) return;
    buf[0] = '\0';
    if (!n) {
        snprintf(buf, size, "(nothing)");
    } else if (n->type == YAML_SCALAR_NODE) {
        snprintf(buf, size, "%s", (const char *)n->data.scalar.value);
    } else if (n->type == YAML_MAPPING_NODE) {
        snprintf(buf, size, "{...}");
    } else {
        size_t len = 0;
        int first = 1;
        len += (size_t)snprintf(buf + len, size - len, "[");
        for (yaml_node_item_t *it = n->data.sequence.items.start;
             it < n->data.sequence.items.top && len + 8 < size; it++) {
            const char *s = scalar(yaml_document_get_node(doc, *it));
            len += (size_t)snprintf(buf + len, size - len, "%s%.*s", first ? "" : ", ",
                                    (int)(size - len > 16 ? size - len - 16 : 0),
                                    s ? s : "...");
            first = 0;
        }
        if (len + 2 < size) snprintf(buf + len, size - len, "]");
    }
}

/* Read a sequence of ints into out (max n); returns count or -1. */
static int int_seq(yaml_document_t *doc, yaml_node_t *n, int *out, int max) {
    if (!n || n->type != YAML_SEQUENCE_NODE) return -1;
    int c = 0;
    for (yaml_node_item_t *it = n->data.sequence.items.start;
         it < n->data.sequence.items.top; it++) {
        if (c >= max) return -1;
        if (parse_int(scalar(yaml_document_get_node(doc, *it)), &out[c]))
            return -1;
        c++;
    }
    return c;
}

lucid_status lucid_data_yaml_read(lucid_ctx *ctx, const char *file,
                                  lucid_data_yaml *out) {
    memset(out, 0, sizeof *out);
    FILE *f = fopen(file, "rb");
    if (!f)
        return lucid_seterr(ctx, LUCID_ERR_IO, "%s: cannot open data YAML: %s",
                            file, strerror(errno));
    yaml_parser_t parser;
    yaml_document_t doc;
    if (!yaml_parser_initialize(&parser)) {
        fclose(f);
        return lucid_seterr(ctx, LUCID_ERR_OOM, "%s: yaml parser init failed",
                            file);
    }
    yaml_parser_set_input_file(&parser, f);
    if (!yaml_parser_load(&parser, &doc)) {
        lucid_status st = lucid_seterr(
            ctx, LUCID_ERR_FORMAT, "%s:%zu: YAML error: %s", file,
            parser.problem_mark.line + 1,
            parser.problem ? parser.problem : "unknown");
        yaml_parser_delete(&parser);
        fclose(f);
        return st;
    }
    yaml_parser_delete(&parser);
    fclose(f);

    lucid_status st = LUCID_OK;
    const char *path = NULL, *train = NULL, *val = NULL;
    int ymlnc = -1;
    size_t flip_line = 0; /* the line of the flip_idx key (its checks below name it) */
    out->kpt_shape[0] = out->kpt_shape[1] = 0;
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    if (!root || root->type != YAML_MAPPING_NODE) {
        st = lucid_seterr(ctx, LUCID_ERR_FORMAT,
                          "%s:1: data YAML must be a mapping", file);
        goto done;
    }
    for (yaml_node_pair_t *pr = root->data.mapping.pairs.start;
         pr < root->data.mapping.pairs.top; pr++) {
        yaml_node_t *kn = yaml_document_get_node(&doc, pr->key);
        yaml_node_t *vn = yaml_document_get_node(&doc, pr->value);
        const char *key = scalar(kn);
        size_t line = vn ? vn->start_mark.line + 1 : 0;
        if (!key) continue;
        if (!strcmp(key, "path")) {
            path = scalar(vn);
            if (!path) {
                st = lucid_seterr(ctx, LUCID_ERR_FORMAT,
                                  "%s:%zu: 'path' must be a string (the "
                                  "dataset root)",
                                  file, line);
                goto done;
            }
        } else if (!strcmp(key, "train") || !strcmp(key, "val")) {
            const char *s = scalar(vn);
            if (!s) {
                st = lucid_seterr(ctx, LUCID_ERR_FORMAT,
                                  "%s:%zu: '%s' must be a string (lists of "
                                  "folders are not supported)",
                                  file, line, key);
                goto done;
            }
            if (key[0] == 't') train = s;
            else val = s;
        } else if (!strcmp(key, "kpt_shape")) {
            if (int_seq(&doc, vn, out->kpt_shape, 2) != 2 ||
                out->kpt_shape[0] < 1 || out->kpt_shape[0] > LUCID_MAX_KPT ||
                (out->kpt_shape[1] != 2 && out->kpt_shape[1] != 3)) {
                char v[96];
                node_text(&doc, vn, v, sizeof v);
                st = lucid_seterr(ctx, LUCID_ERR_FORMAT,
                                  "%s:%zu: kpt_shape = %s: must be [K, D] with "
                                  "1 <= K <= %d and D in {2,3}",
                                  file, line, v, LUCID_MAX_KPT);
                goto done;
            }
        } else if (!strcmp(key, "flip_idx")) {
            int c = int_seq(&doc, vn, out->flip_idx, LUCID_MAX_KPT);
            if (c < 0) {
                char v[96];
                node_text(&doc, vn, v, sizeof v);
                st = lucid_seterr(ctx, LUCID_ERR_FORMAT,
                                  "%s:%zu: flip_idx = %s: must be a list of at "
                                  "most %d integers",
                                  file, line, v, LUCID_MAX_KPT);
                goto done;
            }
            out->nflip = c;
            out->has_flip_idx = 1;
            flip_line = line;
        } else if (!strcmp(key, "nc")) {
            if (parse_int(scalar(vn), &ymlnc) || ymlnc < 1) {
                st = lucid_seterr(ctx, LUCID_ERR_FORMAT,
                                  "%s:%zu: nc must be a positive integer",
                                  file, line);
                goto done;
            }
        } else if (!strcmp(key, "names")) {
            int cnt = 0;
            if (vn->type == YAML_SEQUENCE_NODE)
                cnt = (int)(vn->data.sequence.items.top -
                            vn->data.sequence.items.start);
            else if (vn->type == YAML_MAPPING_NODE)
                cnt = (int)(vn->data.mapping.pairs.top -
                            vn->data.mapping.pairs.start);
            else {
                st = lucid_seterr(ctx, LUCID_ERR_FORMAT,
                                  "%s:%zu: names must be a list or a mapping",
                                  file, line);
                goto done;
            }
            out->names = calloc(cnt > 0 ? cnt : 1, sizeof(char *));
            if (!out->names) {
                st = lucid_seterr(ctx, LUCID_ERR_OOM, "%s: out of memory", file);
                goto done;
            }
            out->nc = cnt;
            for (int i = 0; i < cnt; i++) {
                const char *nm;
                int id = i;
                if (vn->type == YAML_SEQUENCE_NODE) {
                    nm = scalar(yaml_document_get_node(
                        &doc, vn->data.sequence.items.start[i]));
                } else {
                    yaml_node_pair_t *q = vn->data.mapping.pairs.start + i;
                    if (parse_int(scalar(yaml_document_get_node(&doc, q->key)),
                                  &id) ||
                        id < 0 || id >= cnt || out->names[id]) {
                        st = lucid_seterr(ctx, LUCID_ERR_FORMAT,
                                          "%s:%zu: 'names' must map each "
                                          "class id 0..%d once to a name",
                                          file, line, cnt - 1);
                        goto done;
                    }
                    nm = scalar(yaml_document_get_node(&doc, q->value));
                }
                out->names[id] = strdup(nm ? nm : "");
                if (!out->names[id]) {
                    st = lucid_seterr(ctx, LUCID_ERR_OOM, "%s: out of memory", file);
                    goto done;
                }
            }
        }
    }
    if (ymlnc > 0 && out->nc > 0 && ymlnc != out->nc) {
        st = lucid_seterr(ctx, LUCID_ERR_FORMAT,
                          "%s: nc = %d but names has %d entries", file, ymlnc,
                          out->nc);
        goto done;
    }
    if (out->nc == 0) {
        if (ymlnc < 1) {
            st = lucid_seterr(ctx, LUCID_ERR_FORMAT,
                              "%s: neither names nor nc is given", file);
            goto done;
        }
        out->names = calloc(ymlnc, sizeof(char *));
        out->nc = ymlnc;
        for (int i = 0; out->names && i < ymlnc; i++) {
            char b[24];
            snprintf(b, sizeof b, "class_%d", i);
            out->names[i] = strdup(b);
        }
    }
    if (out->has_flip_idx && out->kpt_shape[0] > 0) {
        st = lucid_flip_idx_check(ctx, out->flip_idx, out->nflip,
                                  out->kpt_shape[0]);
        if (st != LUCID_OK) {
            char m[512];
            snprintf(m, sizeof m, "%s", lucid_ctx_error(ctx));
            st = lucid_seterr(ctx, LUCID_ERR_FORMAT, "%s:%zu: %s", file, flip_line, m);
            goto done;
        }
    }
    {
        /* folder of the YAML file */
        char *dir = strdup(file);
        if (!dir) { st = lucid_seterr(ctx, LUCID_ERR_OOM, "out of memory"); goto done; }
        char *slash = strrchr(dir, '/');
        if (slash) *slash = 0;
        else strcpy(dir, ".");
        out->dir = dir;
        out->path = path ? strdup(path) : NULL;
        out->train = train ? strdup(train) : NULL;
        out->val = val ? strdup(val) : NULL;
        if ((path && !out->path) || (train && !out->train) || (val && !out->val)) {
            st = lucid_seterr(ctx, LUCID_ERR_OOM, "%s: out of memory", file);
            goto done;
        }
    }
done:
    yaml_document_delete(&doc);
    if (st != LUCID_OK) lucid_data_yaml_free(out);
    return st;
}
