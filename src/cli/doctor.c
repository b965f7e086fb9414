/* pysbx doctor: which layers of confinement this machine gives, and why not
 * where it does not. */
#define _GNU_SOURCE
#include "commands.h"
#include "options.h"

#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/utsname.h>

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
    opts_config(&o, &cfg, tmpl, sizeof(tmpl));
    cfg.required_layers = 0; /* report, whatever is missing */
    int rc = sbx_open(&cfg, &sbx, &err);
    opts_free(&o);
    if (rc < 0) {
        fprintf(stderr, "pysbx: cannot start the sandbox: %s\n", err.message);
        return EXIT_SANDBOX;
    }
    sbx_layers(sbx, layers);
    uname(&u);
    if (json) {
        json_t *doc = json_pack("{s:s, s:s, s:s, s:s}", "pysbx", PYSBX_VERSION, "python",
                                sbx_python_version(sbx), "libseccomp", sbx_libseccomp_version(sbx),
                                "kernel", u.release);
        json_t *l = json_object();
        for (int i = 0; i < SBX_LAYER_COUNT; i++)
            json_object_set_new(l, layers[i].name,
                                json_pack("{s:b, s:b, s:s}", "active", layers[i].active, "required",
                                          (required & layers[i].layer) != 0, "detail",
                                          layers[i].detail));
        json_object_set_new(doc, "layers", l);
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
    }
    if (sbx_check_layers(sbx, required, &err) < 0) {
        fprintf(stderr, "pysbx: %s\n", err.message);
        status = 1;
    }
    sbx_close(sbx);
    return status;
}
