/* A C service's use of the library, in full: open once, run, read the
 * result, close. Built against an installed libpysbx with pkg-config:
 *
 *   cc embed.c $(pkg-config --cflags --libs pysbx) -o embed
 */
#include <pysbx.h>

#include <stdio.h>
#include <string.h>

int main(void)
{
    struct sbx_config cfg;
    struct sbx_error err;
    struct sbx *sbx;

    sbx_config_init(&cfg);
    if (sbx_open(&cfg, &sbx, &err) < 0) {
        fprintf(stderr, "cannot open the sandbox: %s\n", err.message);
        return 1;
    }

    const struct sbx_file data = {"numbers.txt", "1\n2\n3\n4\n", 8};
    struct sbx_request req;
    sbx_request_init(&req);
    req.code = "total = sum(int(line) for line in open('numbers.txt'))\n"
               "open('total.txt', 'w').write(str(total))\n"
               "print('total', total)\n";
    req.code_len = strlen(req.code);
    req.files = &data;
    req.n_files = 1;
    req.limits.wall_seconds = 2;

    struct sbx_result *res;
    if (sbx_run(sbx, &req, &res, &err) < 0) {
        fprintf(stderr, "refused: %s: %s\n", sbx_error_code_name(err.code), err.message);
        sbx_close(sbx);
        return 1;
    }
    printf("status %s, exit code %d\n%s", sbx_status_name(res->status), res->exit_code,
           res->stdout_text);
    for (size_t i = 0; i < res->n_artifacts; i++)
        printf("artifact %s: %.*s\n", res->artifacts[i].name, (int)res->artifacts[i].data_len,
               (const char *)res->artifacts[i].data);
    int ok = res->status == SBX_COMPLETED && res->exit_code == 0;
    sbx_result_free(res);
    sbx_close(sbx);
    return ok ? 0 : 1;
}
