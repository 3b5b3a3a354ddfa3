/*
 * test_data_labels.c — label rows, flip_idx, data YAML, dataset scanning
 * with the reject policy, and the real mini dataset (zero rejects; COCO JSON
 * gives the same labels as the txt files).
 */
#include "test.h"
#include "test_data_util.h"

static lucid_ctx *ctx;

static const char *ROW_OK =
    "0 0.5 0.5 0.2 0.4 0.5 0.4 2 0.52 0.38 2 0.48 0.38 1\n";

static lucid_pose_spec spec3(void) {
    lucid_pose_spec s;
    memset(&s, 0, sizeof s);
    s.nkpt = 3;
    s.ndim = 3;
    s.has_flip_idx = 1;
    s.flip_idx[0] = 0; s.flip_idx[1] = 2; s.flip_idx[2] = 1;
    s.nc = 1;
    return s;
}

static void expect_row(const char *name, const char *text, lucid_reject want,
                       int want_line, const char *needle) {
    lucid_pose_spec s = spec3();
    lucid_labels l;
    lucid_reject why;
    int line;
    lucid_status st = lucid_labels_parse(ctx, "lbl.txt", text, strlen(text), &s,
                                         &l, &why, &line);
    char tag[32];
    snprintf(tag, sizeof tag, "lbl.txt:%d:", want_line);
    const char *msg = lucid_ctx_error(ctx);
    CHECK(name, st == LUCID_ERR_FORMAT && why == want && line == want_line &&
          strstr(msg, tag) && strstr(msg, needle),
          "status %s reason %s line %d message '%s'", lucid_status_name(st),
          lucid_reject_name(why), line, msg);
    lucid_labels_free(&l);
}

static void test_rows(void) {
    lucid_pose_spec s = spec3();
    lucid_labels l;
    lucid_reject why;
    int line;
    char text[1024];
    snprintf(text, sizeof text, "%s\n%s%s", ROW_OK, ROW_OK,
             "0 0.1 0.1 0.1 0.1 0 0 0 0.1 0.1 2 0.12 0.1 1\n");
    lucid_status st = lucid_labels_parse(ctx, "ok.txt", text, strlen(text), &s,
                                         &l, &why, &line);
    CHECK("parse good rows (blank line ignored, duplicate removed)",
          st == LUCID_OK && l.n == 2 && l.ndup == 1 && l.kpts[2] == 2.f &&
          fabsf(l.kpts[3 * 3 + 0]) == 0.f && l.kpts[3 * 3 + 2] == 0.f &&
          fabsf(l.box[2] - 0.2f) < 1e-7f,
          "st %d n %d dup %d %s", st, l.n, l.ndup, lucid_ctx_error(ctx));
    lucid_labels_free(&l);

    expect_row("row with 13 columns -> label_columns naming file:line",
               "0 0.5 0.5 0.2 0.4 0.5 0.4 2 0.52 0.38 2 0.48 0.38\n",
               LUCID_REJECT_LABEL_COLUMNS, 1, "13 columns, expected 14");
    snprintf(text, sizeof text, "%s%s", ROW_OK,
             "0 0.5 0.5 0.2 0.4 0.5 nan 2 0.52 0.38 2 0.48 0.38 1\n");
    expect_row("nan -> label_nonfinite on line 2", text,
               LUCID_REJECT_LABEL_NONFINITE, 2, "not finite");
    expect_row("inf -> label_nonfinite", "0 0.5 0.5 0.2 inf 0.5 0.4 2 0.52 0.38 2 0.48 0.38 1\n",
               LUCID_REJECT_LABEL_NONFINITE, 1, "column 5");
    expect_row("coordinate 1.5 -> label_range",
               "0 0.5 0.5 0.2 0.4 1.5 0.4 2 0.52 0.38 2 0.48 0.38 1\n",
               LUCID_REJECT_LABEL_RANGE, 1, "keypoint 0");
    expect_row("negative box -> label_range",
               "0 -0.1 0.5 0.2 0.4 0.5 0.4 2 0.52 0.38 2 0.48 0.38 1\n",
               LUCID_REJECT_LABEL_RANGE, 1, "box column 2");
    expect_row("class 3 with nc=1 -> label_class",
               "3 0.5 0.5 0.2 0.4 0.5 0.4 2 0.52 0.38 2 0.48 0.38 1\n",
               LUCID_REJECT_LABEL_CLASS, 1, "class 3");
    expect_row("visibility 3 -> label_visibility",
               "0 0.5 0.5 0.2 0.4 0.5 0.4 3 0.52 0.38 2 0.48 0.38 1\n",
               LUCID_REJECT_LABEL_VISIBILITY, 1, "visibility 3");
    expect_row("token 'abc' -> label_number", "\n\n0 0.5 abc 0.2\n",
               LUCID_REJECT_LABEL_NUMBER, 3, "'abc'");

    int good[3] = {0, 2, 1}, notperm[3] = {0, 1, 1}, notinv[4] = {1, 2, 3, 0},
        range[3] = {0, 3, 1};
    CHECK("flip_idx [0,2,1] valid", lucid_flip_idx_check(ctx, good, 3, 3) == LUCID_OK,
          "%s", lucid_ctx_error(ctx));
    CHECK("flip_idx not a permutation rejected",
          lucid_flip_idx_check(ctx, notperm, 3, 3) == LUCID_ERR_ARG &&
          strstr(lucid_ctx_error(ctx), "own inverse"), "%s", lucid_ctx_error(ctx));
    CHECK("flip_idx permutation but not an involution rejected",
          lucid_flip_idx_check(ctx, notinv, 4, 4) == LUCID_ERR_ARG,
          "%s", lucid_ctx_error(ctx));
    CHECK("flip_idx out of range rejected",
          lucid_flip_idx_check(ctx, range, 3, 3) == LUCID_ERR_ARG &&
          strstr(lucid_ctx_error(ctx), "flip_idx[1] = 3"), "%s", lucid_ctx_error(ctx));
    CHECK("flip_idx wrong length rejected",
          lucid_flip_idx_check(ctx, good, 3, 17) == LUCID_ERR_ARG, "%s",
          lucid_ctx_error(ctx));

    /* 2-D keypoints: v derived */
    lucid_pose_spec s2 = spec3();
    s2.ndim = 2;
    const char *t2 = "0 0.5 0.5 0.2 0.4 0.5 0.4 0.52 0.38 0.48 0.38\n";
    st = lucid_labels_parse(ctx, "d2.txt", t2, strlen(t2), &s2, &l, &why, &line);
    CHECK("kpt_shape [3,2]: v derived as 1", st == LUCID_OK && l.n == 1 &&
          l.kpts[2] == 1 && l.kpts[5] == 1, "%s", lucid_ctx_error(ctx));
    lucid_labels_free(&l);

    /* orientation of labels: 6 = rotate 90 CW: (x, y) -> (1 - y, x) */
    st = lucid_labels_parse(ctx, "o.txt", ROW_OK, strlen(ROW_OK), &s, &l, &why, &line);
    lucid_labels_orient(&l, 3, 6);
    CHECK("labels_orient 6: centre and w/h", st == LUCID_OK &&
          fabsf(l.box[0] - 0.5f) < 1e-7f && fabsf(l.box[2] - 0.4f) < 1e-7f &&
          fabsf(l.box[3] - 0.2f) < 1e-7f && fabsf(l.kpts[3] - 0.62f) < 1e-6f &&
          fabsf(l.kpts[4] - 0.52f) < 1e-6f, "box %g %g %g %g kp1 %g %g",
          l.box[0], l.box[1], l.box[2], l.box[3], l.kpts[3], l.kpts[4]);
    lucid_labels_free(&l);
}

/* Write text to the data YAML at path and check that reading it fails with
 * ERR_FORMAT, the message holding need and (when not NULL) need2. */
static void check_yaml_refused(const char *name, const char *path, const char *text,
                               const char *need, const char *need2) {
    lucid_data_yaml y;
    tdu_write_text(path, text);
    lucid_status st = lucid_data_yaml_read(ctx, path, &y);
    const char *e = lucid_ctx_error(ctx);
    CHECK(name, st == LUCID_ERR_FORMAT && strstr(e, need) && (!need2 || strstr(e, need2)),
          "%s", e);
}

static void test_yaml(void) {
    char root[256], p[512];
    tdu_make_split(root, sizeof root, "train");
    snprintf(p, sizeof p, "%s/data.yaml", root);
    tdu_write_text(p,
                   "# pose data\npath: .\ntrain: images/train\nval: images/val\n"
                   "kpt_shape: [17, 3]\n"
                   "flip_idx: [0, 2, 1, 4, 3, 6, 5, 8, 7, 10, 9, 12, 11, 14, 13, 16, 15]\n"
                   "names:\n  0: person\n");
    lucid_data_yaml y;
    lucid_status st = lucid_data_yaml_read(ctx, p, &y);
    /* path, train, val as written; the YAML's folder beside them (the Lua
     * side resolves them as Ultralytics does) */
    CHECK("data yaml read", st == LUCID_OK && y.kpt_shape[0] == 17 &&
          y.kpt_shape[1] == 3 && y.nflip == 17 && y.flip_idx[1] == 2 &&
          y.nc == 1 && !strcmp(y.names[0], "person") && !strcmp(y.train, "images/train") &&
          !strcmp(y.val, "images/val") && !strcmp(y.path, ".") && !strcmp(y.dir, root),
          "st %d %s train %s dir %s", st, lucid_ctx_error(ctx), st ? "" : y.train,
          st ? "" : y.dir);
    if (st == LUCID_OK) lucid_data_yaml_free(&y);

    tdu_write_text(p, "train: a\nval: b\nkpt_shape: [1, 3]\nnames:\n  2: c\n  0: a\n  1: b\n");
    st = lucid_data_yaml_read(ctx, p, &y);
    CHECK("data yaml names: a mapping in any order; path absent", st == LUCID_OK && y.nc == 3 &&
          !strcmp(y.names[0], "a") && !strcmp(y.names[2], "c") && y.path == NULL,
          "%s", lucid_ctx_error(ctx));
    if (st == LUCID_OK) lucid_data_yaml_free(&y);
    tdu_write_text(p, "train: a\nnc: 2\n");
    st = lucid_data_yaml_read(ctx, p, &y);
    CHECK("data yaml with only nc: names class_0, class_1 (Ultralytics)", st == LUCID_OK &&
          y.nc == 2 && !strcmp(y.names[1], "class_1"), "%s", lucid_ctx_error(ctx));
    if (st == LUCID_OK) lucid_data_yaml_free(&y);
    check_yaml_refused("data yaml names with a repeated id is refused naming file, line and key",
                       p, "train: a\nnames:\n  0: a\n  0: b\n", "data.yaml:3:", "'names'");
    check_yaml_refused("data yaml path that is not a string is refused naming the key", p,
                       "path: [a, b]\ntrain: a\nnc: 1\n", "'path'", NULL);

    check_yaml_refused("data yaml with bad flip_idx rejected naming the file", p,
                       "path: .\ntrain: a\nkpt_shape: [3, 3]\nflip_idx: [0, 2, 2]\n"
                       "names: [person]\n",
                       "data.yaml", "flip_idx");
    check_yaml_refused("data yaml syntax error names file:line", p,
                       "path: .\ntrain: a\nkpt_shape: [3, 3\nnames: [person]\n", "data.yaml:",
                       NULL);
    tdu_rm_rf(root);
}

/* A split with good images and one of each bad kind. */
static void test_dataset_policy(void) {
    char root[256], p[600];
    tdu_make_split(root, sizeof root, "train");
    int w = 40, h = 30;
    uint8_t *rgb = malloc((size_t)w * h * 3);
    for (int i = 0; i < w * h * 3; i++) rgb[i] = (uint8_t)(i * 5);
    const char *goods[6] = {"g0", "g1", "g2", "g3", "g4", "g5"};
    for (int i = 0; i < 6; i++) {
        snprintf(p, sizeof p, "%s/images/train/%s.jpg", root, goods[i]);
        tdu_write_jpeg(p, rgb, w, h, 3, 90, 0, 1);
        snprintf(p, sizeof p, "%s/labels/train/%s.txt", root, goods[i]);
        if (i != 5) tdu_write_text(p, ROW_OK); /* g5: no label (background) */
    }
    /* bad images */
    uint8_t *buf = NULL;
    snprintf(p, sizeof p, "%s/images/train/g0.jpg", root);
    long n = tdu_read_file(p, &buf);
    snprintf(p, sizeof p, "%s/images/train/b_trunc.jpg", root);
    tdu_write_bytes(p, buf, n / 2);
    snprintf(p, sizeof p, "%s/images/train/b_empty.jpg", root);
    tdu_write_bytes(p, buf, 0);
    snprintf(p, sizeof p, "%s/images/train/b_small.png", root);
    tdu_write_png(p, rgb, 8, 8, PNG_COLOR_TYPE_RGB, 8, 0, 0, NULL, 0, 1);
    free(buf);
    /* bad labels on good images */
    const char *badrows[3][2] = {
        {"b_cols", "0 0.5 0.5 0.2 0.4\n"},
        {"b_nan", "0 0.5 0.5 0.2 0.4 0.5 0.4 2 0.52 nan 2 0.48 0.38 1\n"},
        {"b_range", "0 0.5 0.5 0.2 0.4 0.5 0.4 2 0.52 0.38 2 0.48 7 1\n"}};
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/images/train/%s.jpg", root, badrows[i][0]);
        tdu_write_jpeg(p, rgb, w, h, 3, 90, 0, 1);
        snprintf(p, sizeof p, "%s/labels/train/%s.txt", root, badrows[i][0]);
        tdu_write_text(p, badrows[i][1]);
    }
    lucid_dataset_options o = lucid_dataset_options_default();
    o.spec = spec3();
    o.imgsz = 64;
    o.max_reject_fraction = 0.5;
    o.threads = 3;
    char dir[512];
    snprintf(dir, sizeof dir, "%s/images/train", root);
    lucid_dataset *ds = NULL;
    lucid_status st = lucid_dataset_open_yolo(ctx, dir, &o, &ds);
    lucid_dataset_stats s;
    memset(&s, 0, sizeof s);
    if (ds) lucid_dataset_get_stats(ds, &s);
    CHECK("policy skip: 6 kept, 6 rejected counted by reason", st == LUCID_OK &&
          s.total == 12 && s.kept == 6 && s.rejected == 6 &&
          s.reject_count[LUCID_REJECT_IMAGE_CORRUPT] == 1 &&
          s.reject_count[LUCID_REJECT_IMAGE_EMPTY] == 1 &&
          s.reject_count[LUCID_REJECT_IMAGE_SMALL] == 1 &&
          s.reject_count[LUCID_REJECT_LABEL_COLUMNS] == 1 &&
          s.reject_count[LUCID_REJECT_LABEL_NONFINITE] == 1 &&
          s.reject_count[LUCID_REJECT_LABEL_RANGE] == 1 &&
          s.missing_labels == 1 && s.instances == 5,
          "st %d %s kept %lld rejected %lld", st, lucid_ctx_error(ctx),
          (long long)s.kept, (long long)s.rejected);
    if (ds) {
        int found = 0;
        for (int64_t k = 0; k < lucid_dataset_num_rejects(ds); k++) {
            const char *m = lucid_dataset_reject_message(ds, k);
            if (strstr(m, "b_nan.txt:1:") && strstr(m, "not finite")) found++;
            if (strstr(m, "b_trunc.jpg") && strstr(m, "JPEG")) found++;
        }
        CHECK("reject messages name file and line", found == 2, "found %d", found);
        char sum[512];
        lucid_dataset_summary(ds, sum, sizeof sum);
        CHECK("summary lists rejects by reason", strstr(sum, "label_nonfinite 1") &&
              strstr(sum, "6 rejected"), "%s", sum);
        lucid_dataset_release(ds);
    }
    o.max_reject_fraction = 0.25;
    st = lucid_dataset_open_yolo(ctx, dir, &o, &ds);
    CHECK("more than max_reject_fraction rejected fails the open",
          st == LUCID_ERR_FORMAT && strstr(lucid_ctx_error(ctx), "max_reject_fraction") &&
          strstr(lucid_ctx_error(ctx), "image_corrupt 1"), "%s", lucid_ctx_error(ctx));
    o.max_reject_fraction = 1.0;
    o.policy = LUCID_POLICY_FAIL;
    st = lucid_dataset_open_yolo(ctx, dir, &o, &ds);
    CHECK("policy fail: first reject (file order) is the error",
          st == LUCID_ERR_FORMAT && strstr(lucid_ctx_error(ctx), "b_cols.txt:1:"),
          "%s", lucid_ctx_error(ctx));
    o.spec.flip_idx[1] = 1;
    o.policy = LUCID_POLICY_SKIP;
    st = lucid_dataset_open_yolo(ctx, dir, &o, &ds);
    CHECK("bad flip_idx in the options fails the open", st == LUCID_ERR_ARG &&
          strstr(lucid_ctx_error(ctx), "flip_idx"), "%s", lucid_ctx_error(ctx));
    /* empty split */
    char root2[256];
    tdu_make_split(root2, sizeof root2, "train");
    snprintf(dir, sizeof dir, "%s/images/train", root2);
    o = lucid_dataset_options_default();
    st = lucid_dataset_open_yolo(ctx, dir, &o, &ds);
    CHECK("empty split fails the open", st == LUCID_ERR_FORMAT &&
          strstr(lucid_ctx_error(ctx), "no usable image"), "%s", lucid_ctx_error(ctx));
    tdu_rm_rf(root2);
    free(rgb);
    tdu_rm_rf(root);
}

static void test_coco_json(void) {
    char root[256], p[600], dir[600];
    tdu_make_split(root, sizeof root, "train");
    uint8_t rgb[40 * 20 * 3];
    memset(rgb, 90, sizeof rgb);
    const char *names[3] = {"a.png", "b.png", "c.png"};
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/images/train/%s", root, names[i]);
        tdu_write_png(p, rgb, 40, 20, PNG_COLOR_TYPE_RGB, 8, 0, 0, NULL, 0, 1);
    }
    snprintf(p, sizeof p, "%s/k.json", root);
    tdu_write_text(p,
        "{\"images\": [{\"id\": 7, \"file_name\": \"b.png\", \"width\": 40, \"height\": 20},\n"
        " {\"id\": 3, \"file_name\": \"a.png\", \"width\": 40, \"height\": 20},\n"
        " {\"id\": 9, \"file_name\": \"c.png\", \"width\": 40, \"height\": 20}],\n"
        " \"categories\": [{\"id\": 1, \"name\": \"person\"}],\n"
        " \"annotations\": [\n"
        "  {\"id\": 1, \"image_id\": 3, \"category_id\": 1, \"iscrowd\": 0, \"num_keypoints\": 2,\n"
        "   \"bbox\": [10, 5, 20, 10], \"keypoints\": [20, 10, 2, 0, 0, 0, 30, 12, 1]},\n"
        "  {\"id\": 2, \"image_id\": 3, \"category_id\": 1, \"iscrowd\": 1, \"num_keypoints\": 0,\n"
        "   \"bbox\": [0, 0, 40, 20], \"keypoints\": [0,0,0,0,0,0,0,0,0]},\n"
        "  {\"id\": 3, \"image_id\": 7, \"category_id\": 1, \"iscrowd\": 0, \"num_keypoints\": 0,\n"
        "   \"bbox\": [1, 1, 5, 5], \"keypoints\": [0,0,0,0,0,0,0,0,0]},\n"
        "  {\"id\": 4, \"image_id\": 9, \"category_id\": 1, \"iscrowd\": 0, \"num_keypoints\": 1,\n"
        "   \"bbox\": [1, 1, 5, 5], \"keypoints\": [1, 1, 2]}]}\n");
    lucid_dataset_options o = lucid_dataset_options_default();
    o.spec = spec3();
    o.imgsz = 64;
    o.max_reject_fraction = 0.5;
    snprintf(dir, sizeof dir, "%s/images/train", root);
    lucid_dataset *ds = NULL;
    lucid_status st = lucid_dataset_open_coco(ctx, p, dir, &o, &ds);
    lucid_dataset_stats s;
    memset(&s, 0, sizeof s);
    if (ds) lucid_dataset_get_stats(ds, &s);
    const lucid_labels *la = ds ? lucid_dataset_labels(ds, 0) : NULL;
    CHECK("coco json: crowd and no-keypoint annotations dropped, bad record rejected",
          st == LUCID_OK && s.kept == 2 && s.crowd == 1 && s.no_keypoints == 1 &&
          s.rejected == 1 && la && la->n == 1 && fabsf(la->box[0] - 0.5f) < 1e-6f &&
          fabsf(la->box[1] - 0.5f) < 1e-6f && fabsf(la->box[2] - 0.5f) < 1e-6f &&
          fabsf(la->kpts[6] - 0.75f) < 1e-6f && fabsf(la->kpts[7] - 0.6f) < 1e-6f &&
          la->kpts[8] == 1 && lucid_dataset_labels(ds, 1)->n == 0,
          "st %d %s kept %lld crowd %lld nokp %lld rej %lld", st, lucid_ctx_error(ctx),
          (long long)s.kept, (long long)s.crowd, (long long)s.no_keypoints,
          (long long)s.rejected);
    if (ds) {
        const char *m = lucid_dataset_reject_message(ds, 0);
        CHECK("coco json: reject names the annotation and image",
              m && strstr(m, "annotation 4") && strstr(m, "c.png") &&
              strstr(m, "3 keypoint values, expected 9"), "%s", m ? m : "(none)");
        lucid_dataset_release(ds);
    }
    tdu_write_text(p, "{\"images\": [\n  {\"id\": 1,, }\n]}\n");
    st = lucid_dataset_open_coco(ctx, p, dir, &o, &ds);
    CHECK("coco json syntax error names file:line", st == LUCID_ERR_FORMAT &&
          strstr(lucid_ctx_error(ctx), "k.json:2:"), "%s", lucid_ctx_error(ctx));
    tdu_rm_rf(root);
}

static void test_mini_dataset(void) {
    char base[512], dir[600], json[700];
    if (!tdu_mini_dataset(base, sizeof base)) {
        TEST_SKIP("real mini dataset loads with zero rejects",
                  "coco-pose-mini not found ($LUCID_DATASETS, ../shared/datasets, datasets)");
        return;
    }
    lucid_dataset_options o = lucid_dataset_options_default();
    o.threads = 2;
    const char *splits[2] = {"train", "val"};
    int want_n[2] = {137, 32}, want_inst[2] = {422, 68};
    lucid_dataset *dsv = NULL;
    for (int i = 0; i < 2; i++) {
        snprintf(dir, sizeof dir, "%s/images/%s", base, splits[i]);
        lucid_dataset *ds = NULL;
        lucid_status st = lucid_dataset_open_yolo(ctx, dir, &o, &ds);
        lucid_dataset_stats s;
        memset(&s, 0, sizeof s);
        if (ds) lucid_dataset_get_stats(ds, &s);
        char name[96];
        snprintf(name, sizeof name, "mini dataset %s: %d images, %d instances, 0 rejects",
                 splits[i], want_n[i], want_inst[i]);
        CHECK(name, st == LUCID_OK && s.kept == want_n[i] && s.rejected == 0 &&
              s.instances == want_inst[i] && s.cache_bytes > 0,
              "st %d %s kept %lld rejected %lld inst %lld", st, lucid_ctx_error(ctx),
              (long long)s.kept, (long long)s.rejected, (long long)s.instances);
        if (i == 1) dsv = ds;
        else if (ds) lucid_dataset_release(ds);
    }
    snprintf(json, sizeof json, "%s/annotations/person_keypoints_val.json", base);
    snprintf(dir, sizeof dir, "%s/images/val", base);
    lucid_dataset *dsj = NULL;
    lucid_status st = lucid_dataset_open_coco(ctx, json, dir, &o, &dsj);
    lucid_dataset_stats s;
    memset(&s, 0, sizeof s);
    if (dsj) lucid_dataset_get_stats(dsj, &s);
    CHECK("mini val COCO JSON: 32 images, 68 kept, crowd/no-kpt dropped",
          st == LUCID_OK && s.kept == 32 && s.instances == 68 &&
          s.crowd + s.no_keypoints == 93 - 68, "st %d %s inst %lld crowd %lld nokp %lld",
          st, lucid_ctx_error(ctx), (long long)s.instances, (long long)s.crowd,
          (long long)s.no_keypoints);
    if (dsj && dsv) {
        /* same images in the same order; labels equal up to rounding (the
         * txt files have 6 decimals) — instances matched by box */
        double maxd = 0;
        int vis_ok = 1, count_ok = 1;
        for (int64_t i = 0; i < lucid_dataset_size(dsv); i++) {
            const lucid_labels *a = lucid_dataset_labels(dsv, i);
            const lucid_labels *b = lucid_dataset_labels(dsj, i);
            if (a->n != b->n) { count_ok = 0; continue; }
            for (int r = 0; r < a->n; r++) {
                int best = -1;
                double bd = 1e9;
                for (int q = 0; q < b->n; q++) {
                    double d = 0;
                    for (int c = 0; c < 4; c++) d += fabs(a->box[r * 4 + c] - b->box[q * 4 + c]);
                    if (d < bd) { bd = d; best = q; }
                }
                for (int c = 0; c < 4; c++) {
                    double d = fabs(a->box[r * 4 + c] - b->box[best * 4 + c]);
                    if (d > maxd) maxd = d;
                }
                for (int k = 0; k < 17; k++) {
                    const float *ka = a->kpts + ((size_t)r * 17 + k) * 3;
                    const float *kb = b->kpts + ((size_t)best * 17 + k) * 3;
                    if (ka[2] != kb[2]) vis_ok = 0;
                    if (ka[2] > 0)
                        for (int c = 0; c < 2; c++)
                            if (fabs(ka[c] - kb[c]) > maxd) maxd = fabs(ka[c] - kb[c]);
                }
            }
        }
        CHECK("COCO JSON labels equal the txt labels (|d| <= 1e-6, same v)",
              count_ok && vis_ok && maxd <= 1e-6, "counts %d vis %d maxd %g",
              count_ok, vis_ok, maxd);
    }
    if (dsj) lucid_dataset_release(dsj);
    if (dsv) lucid_dataset_release(dsv);
}

int main(void) {
    char err[256];
    if (lucid_ctx_create(NULL, &ctx, err, sizeof err) != LUCID_OK) {
        printf("not ok context: %s\n", err);
        return 1;
    }
    test_rows();
    test_yaml();
    test_dataset_policy();
    test_coco_json();
    test_mini_dataset();
    lucid_ctx_release(ctx);
    return test_exit();
}
