/*
 * The local cluster's stand-in for Pyxis (NVIDIA's SPANK plugin that runs a job step's tasks in an
 * Enroot container): a SPANK plugin, so that srun takes the same options the cluster's Pyxis does and
 * the payloads' srun lines run unchanged. Built and loaded by cluster.sh up, through a file in the
 * /etc/slurm/plugstack.conf.d/ that Debian's plugstack.conf includes:
 *
 *   optional <this .so> helper=<container_root.sh> enroot_conf=<the node's enroot.conf> node_root=<its disk>
 *
 * Options: --container-image=PATH (an Enroot squash file; Pyxis also pulls registry images, this does not),
 * --container-mounts=SRC:DST[:ro|rw][,...] and --container-workdir=DIR, on srun (Pyxis's sbatch options, which
 * run the batch script itself in the image, are not taken here). For each task that names an image,
 * in the task's process before Slurm drops to the user: a private mount namespace, the helper mounts the
 * image read-only under a writable layer on a tmpfs over the node's Enroot runtime folder, with /proc, /sys, /dev,
 * the node's /etc/hosts and the named mounts, then the task is confined to it (chroot) and gets the image's
 * environment (/etc/environment, which overrides the job's as in Pyxis). Each task starts from the image
 * as built and its writes go when it ends, as with Pyxis's unnamed containers.
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <slurm/spank.h>

SPANK_PLUGIN(pyxis_standin, 1);

static char *image, *mounts, *workdir;
static char helper[4096], enroot_conf[4096], node_root[4096], root[4096];

static int set_option(int val, const char *optarg, int remote)
{
    char **slot = val == 0 ? &image : val == 1 ? &mounts : &workdir;
    (void)remote;
    if (optarg == NULL || *optarg == '\0') {
        slurm_error("pyxis: --container-%s needs a value", val == 0 ? "image" : val == 1 ? "mounts" : "workdir");
        return -1;
    }
    free(*slot);
    *slot = strdup(optarg);
    return *slot ? 0 : -1;
}

struct spank_option spank_options[] = {
    {"container-image", "PATH", "[pyxis] the Enroot squash file to run the tasks in", 1, 0, set_option},
    {"container-mounts", "SRC:DST[:FLAGS][,...]", "[pyxis] bind mounts into the container", 1, 1, set_option},
    {"container-workdir", "DIR", "[pyxis] working directory inside the container", 1, 2, set_option},
    SPANK_OPTIONS_TABLE_END};

static void plugin_args(int ac, char **av)
{
    for (int i = 0; i < ac; i++) {
        if (strncmp(av[i], "helper=", 7) == 0)
            snprintf(helper, sizeof helper, "%s", av[i] + 7);
        else if (strncmp(av[i], "enroot_conf=", 12) == 0)
            snprintf(enroot_conf, sizeof enroot_conf, "%s", av[i] + 12);
        else if (strncmp(av[i], "node_root=", 10) == 0)
            snprintf(node_root, sizeof node_root, "%s", av[i] + 10);
    }
}

/* The image's environment: KEY=VALUE lines of ROOT/etc/environment, set over the job's. */
static int image_environment(spank_t sp)
{
    char path[4200], line[8192];
    snprintf(path, sizeof path, "%s/etc/environment", root);
    FILE *file = fopen(path, "r");
    if (file == NULL)
        return 0;
    while (fgets(line, sizeof line, file)) {
        line[strcspn(line, "\n")] = '\0';
        char *eq = strchr(line, '=');
        if (line[0] == '#' || eq == NULL)
            continue;
        *eq = '\0';
        spank_setenv(sp, line, eq + 1, 1);
    }
    fclose(file);
    return 0;
}

int slurm_spank_task_init_privileged(spank_t sp, int ac, char **av)
{
    uint32_t job = 0, step = 0;
    int task = 0, status = 0;
    if (image == NULL)
        return 0;
    plugin_args(ac, av);
    if (helper[0] == '\0') {
        slurm_error("pyxis: the plugin's helper= argument is missing in plugstack.conf");
        return -1;
    }
    spank_get_item(sp, S_JOB_ID, &job);
    spank_get_item(sp, S_JOB_STEPID, &step);
    spank_get_item(sp, S_TASK_ID, &task);
    if (unshare(CLONE_NEWNS) != 0) {
        slurm_error("pyxis: unshare(CLONE_NEWNS): %m");
        return -1;
    }
    /* The helper mounts the container's root in this namespace and prints its path. */
    int out[2];
    char name[64];
    snprintf(name, sizeof name, "pyxis_%u.%u.%d", job, step, task);
    if (pipe(out) != 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        dup2(out[1], STDOUT_FILENO);
        close(out[0]);
        close(out[1]);
        execl("/bin/bash", "bash", helper, image, name, mounts ? mounts : "", enroot_conf, node_root, (char *)NULL);
        _exit(127);
    }
    close(out[1]);
    ssize_t n = read(out[0], root, sizeof root - 1);
    close(out[0]);
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || n <= 0) {
        slurm_error("pyxis: could not start a container from %s (helper exit %d)", image,
                    WIFEXITED(status) ? WEXITSTATUS(status) : -1);
        return -1;
    }
    root[n] = '\0';
    root[strcspn(root, "\n")] = '\0';
    image_environment(sp);
    if (chroot(root) != 0 || chdir("/") != 0) {
        slurm_error("pyxis: entering the container (%s): %m", root);
        return -1;
    }
    return 0;
}

/* Just before exec, as the user: Slurm has moved the task to the job's folder by now (inside the container). */
int slurm_spank_task_init(spank_t sp, int ac, char **av)
{
    (void)sp;
    (void)ac;
    (void)av;
    if (image != NULL && workdir != NULL && chdir(workdir) != 0) {
        slurm_error("pyxis: --container-workdir=%s: %m", workdir);
        return -1;
    }
    return 0;
}
