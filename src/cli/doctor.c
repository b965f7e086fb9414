/* pysbx doctor: which layers of confinement this machine gives, and why not
 * where it does not. */
#define _GNU_SOURCE
#include "commands.h"
#include "options.h"

#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

/* Asked from inside a run, so that it shows what code there sees: every
 * distribution it can find, with its version, and whether each named one
 * imports. One line each: "name version" or "name version ERROR". */
static const char packages_probe[] = "import importlib, importlib.metadata as md\n"
                                     "seen = {}\n"
                                     "for d in md.distributions():\n"
                                     "    seen[d.metadata['Name']] = d.version\n"
                                     "for name in sorted(seen, key=str.lower):\n"
                                     "    print(name, seen[name])\n";

/* What a run can import: "name version" lines, or NULL (then |why|). */
static char *probe_packages(struct sbx *sbx, const char *const *named, char *why, size_t cap)
{
    struct sbx_request req;
    struct sbx_result *res = NULL;
    struct sbx_error err = {0};
    char code[4096];
    size_t n = (size_t)snprintf(code, sizeof(code), "%s", packages_probe);
    char *out = NULL;

    for (const char *const *p = named; p && *p && n < sizeof(code); p++)
        n += (size_t)snprintf(code + n, sizeof(code) - n,
                              "try:\n    importlib.import_module('%s')\n"
                              "except Exception as e:\n"
                              "    print('cannot import %s:', type(e).__name__, e)\n",
                              *p, *p);
    sbx_request_init(&req);
    req.code = code;
    req.code_len = strlen(code);
    if (sbx_run(sbx, &req, &res, &err) < 0)
        snprintf(why, cap, "%s", err.message);
    else if (res->status != SBX_COMPLETED || res->exit_code != 0)
        snprintf(why, cap, "the probe ended %s: %s", sbx_status_name(res->status),
                 res->stderr_text);
    else
        out = strdup(res->stdout_text);
    sbx_result_free(res);
    return out;
}

int cmd_doctor(int argc, char **argv)
{
    struct opts o;
    struct sbx_config cfg;
    struct sbx_error err = {0};
    struct sbx *sbx = NULL;
    struct sbx_layer_info layers[SBX_LAYER_COUNT];
    struct utsname u;
    char tmpl[PATH_MAX];
    int status = parse_opts(CMD_DOCTOR, argc, argv, &o);

    if (status != 0)
        return status < 0 ? 0 : status;
    unsigned required = o.required;
    bool json = o.json;
    char why[512] = "";
    char *pkgs = NULL;
    opts_config(&o, &cfg, tmpl, sizeof(tmpl));
    cfg.required_layers = 0; /* report, whatever is missing */
    int rc = sbx_open(&cfg, &sbx, &err);
    if (rc == 0 && o.packages && !(pkgs = probe_packages(sbx, cfg.packages, why, sizeof(why))))
        status = 1;
    opts_free(&o);
    if (rc < 0)
        return open_error(CMD_DOCTOR, &err);
    sbx_layers(sbx, layers);
    uname(&u);
    /* What --require asks, the default spelled out: seccomp, uidrun when
     * root, and one of landlock and root (either confines the files). */
    bool by_default = (required & SBX_LAYERS_DEFAULT) != 0;
    unsigned strict = required & ~SBX_LAYERS_DEFAULT;
    if (by_default)
        strict |= SBX_LAYER_SECCOMP | (geteuid() == 0 ? SBX_LAYER_UIDRUN : 0);
    if (json) {
        json_t *doc = json_pack("{s:s, s:s, s:s, s:s}", "pysbx", PYSBX_VERSION, "python",
                                sbx_python_version(sbx), "libseccomp", sbx_libseccomp_version(sbx),
                                "kernel", u.release);
        json_t *l = json_object();
        for (int i = 0; i < SBX_LAYER_COUNT; i++)
            json_object_set_new(l, layers[i].name,
                                json_pack("{s:b, s:b, s:s}", "active", layers[i].active, "required",
                                          (strict & layers[i].layer) != 0, "detail",
                                          layers[i].detail));
        json_object_set_new(doc, "layers", l);
        /* Each list: at least one of its layers must be active. */
        json_object_set_new(doc, "required_one_of",
                            by_default ? json_pack("[[s, s]]", "landlock", "root") : json_array());
        if (pkgs) {
            json_t *p = json_object();
            for (char *save = NULL, *line = strtok_r(pkgs, "\n", &save); line;
                 line = strtok_r(NULL, "\n", &save)) {
                char *sp = strrchr(line, ' ');
                if (sp && strncmp(line, "cannot import ", 14) != 0) {
                    *sp = '\0';
                    json_object_set_new(p, line, json_string(sp + 1));
                }
            }
            json_object_set_new(doc, "packages", p);
        }
        char *text = json_dumps(doc, JSON_INDENT(2));
        if (text)
            puts(text);
        free(text);
        json_decref(doc);
    } else {
        printf("pysbx       %s\npython      %s\nlibseccomp  %s\nkernel      %s %s\n\n",
               PYSBX_VERSION, sbx_python_version(sbx), sbx_libseccomp_version(sbx), u.sysname,
               u.release);
        for (int i = 0; i < SBX_LAYER_COUNT; i++)
            printf("%-9s %-12s %s\n", layers[i].name, layers[i].active ? "active" : "UNAVAILABLE",
                   layers[i].detail);
        printf("\nrequired:");
        for (int i = 0, n = 0; i < SBX_LAYER_COUNT; i++)
            if (strict & layers[i].layer)
                printf("%s %s", n++ ? "," : "", layers[i].name);
        printf("%s%s\n",
               by_default ? (strict ? "; and landlock or root" : " landlock or root") : "",
               !strict && !by_default ? " none" : "");
        if (pkgs)
            printf("\nimportable in a run (distribution, version):\n%s", pkgs);
    }
    if (pkgs && strstr(pkgs, "cannot import ")) {
        fprintf(stderr, "pysbx: a named package does not import\n");
        status = 1;
    }
    if (!pkgs && why[0]) {
        fprintf(stderr, "pysbx: listing the packages: %s\n", why);
        status = 1;
    }
    free(pkgs);
    if (sbx_check_layers(sbx, required, &err) < 0) {
        fprintf(stderr, "pysbx: %s\n", err.message);
        status = 1;
    }
    sbx_close(sbx);
    return status;
}
