/* What a process inside a unit observes of its hardening, one `key: value`
 * line per fact (docs/gvisor.md). Built static by scripts/gvisor-probe.sh so
 * it runs in any image:  gcc -static -O2 -o hardening-probe hardening-probe.c
 *
 *   hardening-probe [UNIX_SOCKET_PATH]
 *
 * Every probe that changes the process (landlock, seccomp, dumpable) runs in
 * a forked child, so each one starts from what the unit gave the process. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/landlock.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

static void status_fields(const char *when) {
    static const char *const wanted[] = {"CapEff", "CapPrm", "CapBnd", "NoNewPrivs", "Seccomp", "Seccomp_filters"};
    char line[256];
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) {
        printf("%s./proc/self/status: %s\n", when, strerror(errno));
        return;
    }
    while (fgets(line, sizeof line, f)) {
        for (size_t i = 0; i < sizeof wanted / sizeof *wanted; i++) {
            size_t n = strlen(wanted[i]);
            if (strncmp(line, wanted[i], n) == 0 && line[n] == ':') {
                char *value = line + n + 1;
                value += strspn(value, " \t");
                printf("%s.%s: %s", when, wanted[i], value);
            }
        }
    }
    fclose(f);
}

static void file_line(const char *key, const char *path) {
    char buf[256] = {0};
    FILE *f = fopen(path, "r");
    if (!f) {
        printf("%s: (%s: %s)\n", key, path, strerror(errno));
        return;
    }
    if (!fgets(buf, sizeof buf, f)) buf[0] = '\n';
    buf[strcspn(buf, "\n")] = 0;
    printf("%s: %s\n", key, buf);
    fclose(f);
}

static void meminfo_total(void) {
    char line[256];
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "MemTotal:", 9) == 0) printf("meminfo.MemTotal: %s", line + 9 + strspn(line + 9, " "));
    fclose(f);
}

/* Run `probe` in a child; report how the child ended. */
static void in_child(const char *name, void (*probe)(void)) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) {
        printf("%s: fork: %s\n", name, strerror(errno));
        return;
    }
    if (pid == 0) {
        probe();
        fflush(stdout);
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    if (WIFSIGNALED(status)) printf("%s.child: killed by signal %d (%s)\n", name, WTERMSIG(status), strsignal(WTERMSIG(status)));
}

static void landlock_probe(void) {
    long abi = syscall(SYS_landlock_create_ruleset, NULL, 0, LANDLOCK_CREATE_RULESET_VERSION);
    if (abi < 0) {
        printf("landlock.abi: error %s (errno %d)\n", strerror(errno), errno);
        return;
    }
    printf("landlock.abi: %ld\n", abi);
    struct landlock_ruleset_attr attr = {.handled_access_fs = LANDLOCK_ACCESS_FS_READ_FILE};
    int fd = (int)syscall(SYS_landlock_create_ruleset, &attr, sizeof attr, 0);
    if (fd < 0) {
        printf("landlock.create_ruleset: error %s\n", strerror(errno));
        return;
    }
    prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
    if (syscall(SYS_landlock_restrict_self, fd, 0) != 0) {
        printf("landlock.restrict_self: error %s\n", strerror(errno));
        return;
    }
    /* No rule allows reading any file: an open for reading must be refused. */
    int file = open("/proc/self/status", O_RDONLY);
    printf("landlock.enforced: %s\n", file < 0 && errno == EACCES ? "yes (open for reading refused: EACCES)"
                                      : file < 0 ? strerror(errno) : "NO (the file opened)");
}

static int install(struct sock_filter *code, unsigned short len, unsigned int flags) {
    struct sock_fprog prog = {.len = len, .filter = code};
    return (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, flags, &prog);
}

#define LOAD_NR BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr))
#define LOAD_ARCH BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch))

static void seccomp_errno_probe(void) {
    static const struct {
        const char *name;
        unsigned int action;
    } actions[] = {{"kill_process", SECCOMP_RET_KILL_PROCESS}, {"kill_thread", SECCOMP_RET_KILL_THREAD},
                   {"trap", SECCOMP_RET_TRAP},                 {"errno", SECCOMP_RET_ERRNO},
                   {"user_notif", SECCOMP_RET_USER_NOTIF},     {"trace", SECCOMP_RET_TRACE},
                   {"log", SECCOMP_RET_LOG},                   {"allow", SECCOMP_RET_ALLOW}};
    for (size_t i = 0; i < sizeof actions / sizeof *actions; i++) {
        unsigned int action = actions[i].action;
        long r = syscall(SYS_seccomp, SECCOMP_GET_ACTION_AVAIL, 0, &action);
        printf("seccomp.action_avail.%s: %s\n", actions[i].name, r == 0 ? "yes" : strerror(errno));
    }
    printf("prctl.set_no_new_privs: %s\n", prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 ? "ok" : strerror(errno));
    /* The shape of box's filter: kill a foreign architecture, then getppid ->
     * EXDEV, every other call allowed; on every thread (TSYNC) as box does. */
    struct sock_filter code[] = {
        LOAD_ARCH,
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
        LOAD_NR,
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_getppid, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EXDEV),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    if (install(code, sizeof code / sizeof *code, SECCOMP_FILTER_FLAG_TSYNC) != 0) {
        printf("seccomp.install_tsync: error %s\n", strerror(errno));
        return;
    }
    printf("seccomp.install_tsync: ok\n");
    long r = syscall(SYS_getppid);
    printf("seccomp.errno_enforced: %s\n", r < 0 && errno == EXDEV ? "yes (getppid -> EXDEV)" : "NO (getppid answered)");
    status_fields("after_seccomp");
    printf("prctl.set_dumpable_0: %s\n", prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0 ? "ok" : strerror(errno));
    printf("prctl.get_dumpable: %d\n", prctl(PR_GET_DUMPABLE, 0, 0, 0, 0));
}

static void seccomp_kill_probe(void) {
    prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
    struct sock_filter code[] = {
        LOAD_NR,
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_getppid, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    if (install(code, sizeof code / sizeof *code, 0) != 0) {
        printf("seccomp.kill: install error %s\n", strerror(errno));
        return;
    }
    syscall(SYS_getppid);
    printf("seccomp.kill: NOT killed (getppid answered)\n");
}

static void unix_socket(const char *path) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (fd < 0) {
        printf("unix.socket: error %s\n", strerror(errno));
        return;
    }
    strncpy(addr.sun_path, path, sizeof addr.sun_path - 1);
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
        printf("unix.connect: error %s (errno %d)\n", strerror(errno), errno);
        close(fd);
        return;
    }
    char buf[128] = {0};
    if (write(fd, "ping\n", 5) != 5) printf("unix.write: error %s\n", strerror(errno));
    ssize_t n = read(fd, buf, sizeof buf - 1);
    if (n > 0) buf[strcspn(buf, "\n")] = 0;
    printf("unix.connect: ok, read %s\n", n > 0 ? buf : "nothing");
    close(fd);
}

int main(int argc, char **argv) {
    struct utsname u;
    if (uname(&u) == 0) printf("uname: %s %s %s %s\n", u.sysname, u.release, u.version, u.machine);
    printf("uid: %d gid: %d\n", (int)getuid(), (int)getgid());
    status_fields("start");
    printf("prctl.no_new_privs: %d\n", prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0));
    int fd = open("/probe-write-test", O_WRONLY | O_CREAT, 0600);
    printf("root.write: %s\n", fd >= 0 ? "allowed" : strerror(errno));
    if (fd >= 0) {
        close(fd);
        unlink("/probe-write-test");
    }
    file_line("cgroup.self", "/proc/self/cgroup");
    file_line("cgroup2.memory.max", "/sys/fs/cgroup/memory.max");
    file_line("cgroup2.pids.max", "/sys/fs/cgroup/pids.max");
    file_line("cgroup1.memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.limit_in_bytes");
    file_line("cgroup1.pids.max", "/sys/fs/cgroup/pids/pids.max");
    meminfo_total();
    printf("nproc: %ld\n", sysconf(_SC_NPROCESSORS_ONLN));
    struct rlimit nofile;
    if (getrlimit(RLIMIT_NOFILE, &nofile) == 0) printf("rlimit.nofile: %llu %llu\n", (unsigned long long)nofile.rlim_cur, (unsigned long long)nofile.rlim_max);
    struct statfs tmp;
    if (statfs("/tmp", &tmp) == 0) printf("tmp.size_bytes: %llu inodes: %llu\n", (unsigned long long)tmp.f_blocks * tmp.f_bsize, (unsigned long long)tmp.f_files);
    in_child("landlock", landlock_probe);
    in_child("seccomp", seccomp_errno_probe);
    in_child("seccomp.kill", seccomp_kill_probe);
    if (argc > 1) unix_socket(argv[1]);
    return 0;
}
