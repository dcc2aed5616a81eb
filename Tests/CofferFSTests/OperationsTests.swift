import CofferTestSupport
import Foundation
import Testing

/// The shell/POSIX operations matrix: each failing operation returns the errno a Linux
/// filesystem gives.
@Suite struct OperationsMatrixTests {
    @Test func errnoMatrix() throws {
        let m = try MountFixture("coffer-fs-errno")
        let root = m.mountPoint
        #expect(mkdir(root + "/d", 0o755) == 0)
        #expect(writeFile(root + "/d/inside", "x") == 0)
        #expect(writeFile(root + "/f", "file") == 0)
        #expect(writeFile(root + "/g", "other") == 0)
        #expect(mkdir(root + "/e", 0o755) == 0)
        #expect(mkdir(root + "/a", 0o755) == 0)
        #expect(mkdir(root + "/a/sub", 0o755) == 0)

        // ENOENT
        #expect(openErrno(root + "/missing", O_RDONLY) == ENOENT)
        #expect(errnoOf { unlink(root + "/missing") } == ENOENT)
        #expect(errnoOf { rmdir(root + "/missing") } == ENOENT)
        #expect(errnoOf { rename(root + "/missing", root + "/x") } == ENOENT)
        #expect(openErrno(root + "/nodir/file", O_WRONLY | O_CREAT) == ENOENT)
        #expect(errnoOf { renameat2(root + "/f", root + "/nothere", flags: RENAME_EXCHANGE_FLAG) } == ENOENT)

        // EEXIST
        #expect(errnoOf { mkdir(root + "/d", 0o755) } == EEXIST)
        #expect(errnoOf { mkdir(root + "/f", 0o755) } == EEXIST)
        #expect(openErrno(root + "/f", O_WRONLY | O_CREAT | O_EXCL) == EEXIST)
        #expect(errnoOf { renameat2(root + "/g", root + "/f", flags: RENAME_NOREPLACE_FLAG) } == EEXIST)
        #expect(errnoOf { symlink("t", root + "/f") } == EEXIST)

        // ENOTEMPTY
        #expect(errnoOf { rmdir(root + "/d") } == ENOTEMPTY)
        #expect(errnoOf { rename(root + "/e", root + "/d") } == ENOTEMPTY)

        // ENOTDIR
        #expect(errnoOf { rmdir(root + "/f") } == ENOTDIR)
        #expect(openErrno(root + "/f/x", O_RDONLY) == ENOTDIR)
        #expect(errnoOf { mkdir(root + "/f/x", 0o755) } == ENOTDIR)
        #expect(errnoOf { rename(root + "/e", root + "/f") } == ENOTDIR)
        #expect(openErrno(root + "/f", O_RDONLY | O_DIRECTORY) == ENOTDIR)

        // EISDIR
        #expect(errnoOf { unlink(root + "/d") } == EISDIR)
        #expect(openErrno(root + "/d", O_WRONLY) == EISDIR)
        #expect(openErrno(root + "/d", O_RDWR) == EISDIR)
        #expect(errnoOf { rename(root + "/f", root + "/e") } == EISDIR)
        #expect(errnoOf { truncate(root + "/d", 0) } == EISDIR)

        // EINVAL: a folder into itself or its own subfolder
        #expect(errnoOf { rename(root + "/a", root + "/a/sub/a") } == EINVAL)
        #expect(errnoOf { rename(root + "/a", root + "/a/a") } == EINVAL)

        // ENAMETOOLONG past 255 bytes; 255 is fine (also in multi-byte UTF-8)
        let long255 = String(repeating: "n", count: 255)
        let long256 = String(repeating: "n", count: 256)
        #expect(writeFile(root + "/" + long255, "ok") == 0)
        #expect(text(readFile(root + "/" + long255)) == "ok")
        #expect(openErrno(root + "/" + long256, O_WRONLY | O_CREAT) == ENAMETOOLONG)
        #expect(openErrno(root + "/" + long256, O_RDONLY) == ENAMETOOLONG)
        #expect(errnoOf { mkdir(root + "/" + long256, 0o755) } == ENAMETOOLONG)
        #expect(errnoOf { rename(root + "/g", root + "/" + long256) } == ENAMETOOLONG)
        #expect(errnoOf { symlink("t", root + "/" + long256) } == ENAMETOOLONG)
        let multi = String(repeating: "é", count: 128)  // 256 bytes
        #expect(openErrno(root + "/" + multi, O_WRONLY | O_CREAT) == ENAMETOOLONG)

        // Hard links, FIFOs and device nodes: refused with EPERM (documented); regular mknod works.
        #expect(errnoOf { link(root + "/f", root + "/hard") } == EPERM)
        #expect(errnoOf { mkfifo(root + "/fifo", 0o644) } == EPERM)
        #expect(errnoOf { mknod(root + "/chr", S_IFCHR | 0o644, dev_t(0x0103)) } == EPERM)
        #expect(errnoOf { mknod(root + "/reg", S_IFREG | 0o644, 0) } == 0)
        #expect(statOf(root + "/reg").map { $0.st_mode & S_IFMT } == S_IFREG)
        #expect(lstatOf(root + "/hard") == nil && lstatOf(root + "/fifo") == nil && lstatOf(root + "/chr") == nil)

        // The successful counterparts leave the expected tree.
        #expect(rename(root + "/e", root + "/a/sub") == 0)  // empty folder over empty folder
        #expect(unlink(root + "/d/inside") == 0)
        #expect(rmdir(root + "/d") == 0)
        #expect(lstatOf(root + "/d") == nil)
        let names = Set((try? FileManager.default.contentsOfDirectory(atPath: root)) ?? [])
        #expect(names == ["a", "f", "g", long255, "reg"])
    }

    /// EACCES and EPERM from mode, uid and gid under default_permissions, as a non-root user.
    @Test func permissionsAsAnotherUser() throws {
        let m = try MountFixture("coffer-fs-perm", options: ["allow_other"])
        let root = m.mountPoint
        chmod(root, 0o755)
        #expect(writeFile(root + "/root644", "root's") == 0)
        chmod(root + "/root644", 0o644)
        #expect(writeFile(root + "/root600", "secret") == 0)
        chmod(root + "/root600", 0o600)
        #expect(writeFile(root + "/group640", "group") == 0)
        chmod(root + "/group640", 0o640)
        chown(root + "/group640", 0, 1000)
        #expect(writeFile(root + "/group604", "not for the group") == 0)
        chmod(root + "/group604", 0o604)
        chown(root + "/group604", 0, 1000)
        #expect(mkdir(root + "/rootdir", 0o755) == 0)
        chmod(root + "/rootdir", 0o755)
        #expect(mkdir(root + "/open", 0o777) == 0)
        chmod(root + "/open", 0o777)
        #expect(mkdir(root + "/sticky", 0o777) == 0)
        chmod(root + "/sticky", 0o1777)
        #expect(writeFile(root + "/sticky/roots", "r") == 0)

        let probe = """
            import os, sys, errno
            op, p = sys.argv[1], sys.argv[2]
            try:
                if op == 'write': os.close(os.open(p, os.O_WRONLY))
                elif op == 'read': print(open(p).read(), end=' ')
                elif op == 'chmod': os.chmod(p, 0o777)
                elif op == 'chown': os.chown(p, 1000, 1000)
                elif op == 'utime': os.utime(p, (1, 1))
                elif op == 'create': os.close(os.open(p, os.O_CREAT | os.O_WRONLY, 0o644))
                elif op == 'mkdir': os.mkdir(p)
                elif op == 'unlink': os.unlink(p)
                elif op == 'touch': os.utime(p, None)
                print('OK')
            except OSError as e:
                print(errno.errorcode[e.errno])
            """
        func asUser(_ op: String, _ rel: String, gid: Int = 1000) -> String {
            let r = py(probe, [op, root + "/" + rel], uid: 1000, gid: gid)
            return r.out.trimmingCharacters(in: .whitespacesAndNewlines)
                + (r.status == 0 ? "" : " status \(r.status): \(r.err)")
        }
        // mode: others may read a 0644 root file but not write it; 0600 is closed to them.
        #expect(asUser("read", "root644") == "root's OK")
        #expect(asUser("write", "root644") == "EACCES")
        #expect(asUser("read", "root600") == "EACCES")
        // uid: only the owner (or root) may chmod, chown or set explicit times.
        #expect(asUser("chmod", "root644") == "EPERM")
        #expect(asUser("chown", "root644") == "EPERM")
        #expect(asUser("utime", "root644") == "EPERM")
        // gid: the group class applies to members (even when it grants less than others).
        #expect(asUser("read", "group640") == "group OK")
        #expect(asUser("read", "group640", gid: 1001) == "EACCES")
        #expect(asUser("read", "group604") == "EACCES")
        #expect(asUser("read", "group604", gid: 1001) == "not for the group OK")
        // folders: no creating or removing in a 0755 root folder; a 0777 one is open.
        #expect(asUser("create", "rootdir/new") == "EACCES")
        #expect(asUser("mkdir", "rootdir/newdir") == "EACCES")
        #expect(asUser("unlink", "root644") == "EACCES")
        #expect(asUser("create", "open/mine") == "OK")
        #expect(asUser("chmod", "open/mine") == "OK")
        // sticky folder: not someone else's file.
        #expect(asUser("unlink", "sticky/roots") == "EPERM")
        let mine = statOf(root + "/open/mine")
        #expect(mine?.st_uid == 1000 && mine?.st_gid == 1000)
        #expect(mine.map { $0.st_mode & 0o7777 } == 0o777)
        // Nothing changed behind the denials.
        #expect(text(readFile(root + "/root644")) == "root's")
        #expect(statOf(root + "/root644").map { $0.st_mode & 0o7777 } == 0o644)
        #expect(lstatOf(root + "/rootdir/new") == nil)
        #expect(lstatOf(root + "/sticky/roots") != nil)
    }

    /// Set-user-id and set-group-id bits are dropped as on a local filesystem: by any chown of a
    /// file, and by a write, truncate or `open(O_TRUNC)` from someone without CAP_FSETID. The
    /// kernel decides and sends the setattr. Set-group-id without group execute (a locking mark,
    /// not a privilege) stays, as the kernel's FUSE rule has it, and so do root's own writes.
    @Test func setIDBitsAreClearedLikeALocalFilesystem() throws {
        let m = try MountFixture("coffer-fs-setid", options: ["allow_other"])
        let root = m.mountPoint
        chmod(root, 0o755)
        func make(_ name: String, _ mode: mode_t) {
            #expect(writeFile(root + "/" + name, "x") == 0)
            #expect(chmod(root + "/" + name, mode) == 0)
            #expect(statOf(root + "/" + name).map { $0.st_mode & 0o7777 } == mode, "\(name) set up")
        }
        func mode(_ name: String) -> mode_t? { statOf(root + "/" + name).map { $0.st_mode & 0o7777 } }
        let probe = """
            import os, sys, errno
            op, p = sys.argv[1], sys.argv[2]
            try:
                if op == 'write':
                    fd = os.open(p, os.O_WRONLY)
                    os.write(fd, b'more')
                    os.close(fd)
                elif op == 'truncate': os.truncate(p, 1)
                elif op == 'trunc-open': os.close(os.open(p, os.O_WRONLY | os.O_TRUNC))
                elif op == 'chown-none': os.chown(p, -1, -1)
                elif op == 'fallocate':
                    fd = os.open(p, os.O_WRONLY)
                    os.posix_fallocate(fd, 0, 4096)
                    os.close(fd)
                elif op == 'create-setuid':
                    os.umask(0o022)
                    os.close(os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o4755))
                print('OK')
            except OSError as e:
                print(errno.errorcode[e.errno])
            """
        func asUser(_ op: String, _ name: String, groups: [Int] = []) -> String {
            let r = py(probe, [op, root + "/" + name], uid: 1000, gid: 1000, groups: groups)
            return r.out.trimmingCharacters(in: .whitespacesAndNewlines)
                + (r.status == 0 ? "" : " status \(r.status): \(r.err)")
        }

        // chown, even by root: both bits go (group execute is set).
        make("chowned", 0o6755)
        #expect(chown(root + "/chowned", 1000, 1000) == 0)
        #expect(mode("chowned") == 0o755)
        // Without group execute root keeps setgid (CAP_FSETID), though not in the file's group.
        make("chowned-lock", 0o6745)
        #expect(chown(root + "/chowned-lock", 1001, 1001) == 0)
        #expect(chmod(root + "/chowned-lock", 0o6745) == 0)
        #expect(chown(root + "/chowned-lock", 1000, gid_t.max) == 0)  // gid -1: unchanged
        #expect(mode("chowned-lock") == 0o2745)
        // chown(f, -1, -1) drops them too, which is a mode change: by the owner or CAP_FOWNER
        // only; another user gets EPERM, as on ext4.
        make("chowned-none", 0o6755)
        #expect(chown(root + "/chowned-none", uid_t.max, gid_t.max) == 0)
        #expect(mode("chowned-none") == 0o755)
        make("chowned-none-by-other", 0o6755)
        #expect(asUser("chown-none", "chowned-none-by-other") == "EPERM")
        #expect(mode("chowned-none-by-other") == 0o6755)
        // fallocate by another user, which carries no flag from the kernel.
        make("fallocated", 0o6777)
        #expect(asUser("fallocate", "fallocated") == "OK")
        #expect(mode("fallocated") == 0o777)
        #expect(statOf(root + "/fallocated")?.st_size == 4096)
        make("fallocated-root", 0o6777)
        let fd = open(root + "/fallocated-root", O_WRONLY | O_CLOEXEC)
        #expect(fd >= 0 && posix_fallocate(fd, 0, 4096) == 0)
        #expect(close(fd) == 0)
        #expect(mode("fallocated-root") == 0o6777)
        // A write by another user (the file is writable by all).
        make("written", 0o6777)
        #expect(asUser("write", "written") == "OK")
        #expect(mode("written") == 0o777)
        #expect(text(readFile(root + "/written")) == "more")
        // truncate(2) and open(O_TRUNC) by another user.
        make("truncated", 0o6777)
        #expect(asUser("truncate", "truncated") == "OK")
        #expect(mode("truncated") == 0o777)
        make("opened", 0o6777)
        #expect(asUser("trunc-open", "opened") == "OK")
        #expect(mode("opened") == 0o777)
        // Set-group-id without group execute is kept, for a member of the file's group (its own
        // gid, or a supplementary group) and for anyone else; set-user-id always goes. (ext4
        // drops it for a writer outside the group; the kernel's rule for FUSE keeps it.)
        make("locking", 0o6767)  // root's group: the writer is not in it
        #expect(asUser("write", "locking") == "OK")
        #expect(mode("locking") == 0o2767)
        make("locking-own", 0o6767)
        #expect(chown(root + "/locking-own", 0, 1000) == 0)
        #expect(chmod(root + "/locking-own", 0o6767) == 0)
        #expect(asUser("write", "locking-own") == "OK")
        #expect(mode("locking-own") == 0o2767)
        make("locking-member", 0o6767)
        #expect(chown(root + "/locking-member", 0, 2000) == 0)
        #expect(chmod(root + "/locking-member", 0o6767) == 0)
        #expect(asUser("truncate", "locking-member", groups: [2000]) == "OK")
        #expect(mode("locking-member") == 0o2767)
        make("locking-trunc", 0o6767)
        #expect(asUser("trunc-open", "locking-trunc") == "OK")
        #expect(mode("locking-trunc") == 0o2767)
        // A file the same open creates keeps the bits its creator asked for: O_TRUNC truncates
        // only a file that was already there.
        #expect(mkdir(root + "/open", 0o777) == 0)
        #expect(chmod(root + "/open", 0o777) == 0)
        #expect(asUser("create-setuid", "open/new") == "OK")
        #expect(mode("open/new") == 0o4755)
        // Root (CAP_FSETID) writes and truncates without losing them.
        make("roots", 0o6777)
        #expect(writeFile(root + "/roots", "root rewrote it") == 0)
        #expect(truncate(root + "/roots", 2) == 0)
        #expect(mode("roots") == 0o6777)
        // What stat showed is what the store holds: the same modes after a remount.
        try m.unmount()
        try m.mount()
        #expect(mode("chowned") == 0o755)
        #expect(mode("chowned-lock") == 0o2745)
        #expect(mode("fallocated") == 0o777)
        #expect(mode("written") == 0o777)
        #expect(mode("truncated") == 0o777)
        #expect(mode("opened") == 0o777)
        #expect(mode("locking") == 0o2767)
        #expect(mode("locking-own") == 0o2767)
        #expect(mode("locking-member") == 0o2767)
        #expect(mode("locking-trunc") == 0o2767)
        #expect(mode("roots") == 0o6777)
        #expect(mode("open/new") == 0o4755)
    }

    /// Mounted by root without allow_other, only root's processes get in and the kernel is not
    /// asked to check modes (see `MountService.kernelChecksPermissions`); what root sees must
    /// still be what it sees on a local filesystem.
    @Test func rootOnlyMountGivesRootsUsualPermissions() throws {
        func mountOptions(_ point: String) -> [String] {
            let mounts = (try? String(contentsOfFile: "/proc/mounts", encoding: .utf8)) ?? ""
            let line = mounts.split(separator: "\n").first {
                $0.split(separator: " ").dropFirst().first.map(String.init) == point
            }
            return line.map { $0.split(separator: " ")[3].split(separator: ",").map(String.init) } ?? []
        }
        let m = try MountFixture("coffer-fs-rootonly")
        let root = m.mountPoint
        let options = mountOptions(root)
        #expect(options.contains("user_id=0"), "\(options)")
        #expect(!options.contains("default_permissions"), "\(options)")

        let script = root + "/script"
        #expect(writeFile(script, "#!/bin/sh\necho ran\n") == 0)
        chmod(script, 0o644)
        let exec = """
            import os, sys, errno
            try:
                os.execv(sys.argv[1], [sys.argv[1]])
            except OSError as e:
                print(errno.errorcode[e.errno])

            """
        // No execute bit anywhere: refused to root too, by access(2) and by exec.
        #expect(errnoOf { access(script, X_OK) } == EACCES)
        #expect(py(exec, [script]).out.trimmingCharacters(in: .whitespacesAndNewlines) == "EACCES")
        chmod(script, 0o744)
        #expect(access(script, X_OK) == 0)
        #expect(py(exec, [script]).out.trimmingCharacters(in: .whitespacesAndNewlines) == "ran")
        // Read-only file, closed folder: root may write and enter, as on ext4.
        chmod(script, 0o444)
        #expect(access(script, R_OK | W_OK) == 0)
        #expect(openErrno(script, O_WRONLY | O_APPEND) == 0)
        #expect(mkdir(root + "/closed", 0o700) == 0)
        chmod(root + "/closed", 0)
        #expect(access(root + "/closed", R_OK | W_OK | X_OK) == 0)
        #expect(writeFile(root + "/closed/inside", "x") == 0)
        #expect(errnoOf { access(root + "/missing", F_OK) } == ENOENT)

        // Anyone else can get in only with allow_other, and then the kernel checks modes.
        let shared = try MountFixture("coffer-fs-rootonly-shared", options: ["allow_other"])
        #expect(mountOptions(shared.mountPoint).contains("default_permissions"))
        let asked = try MountFixture("coffer-fs-rootonly-asked", options: ["default_permissions"])
        #expect(mountOptions(asked.mountPoint).filter { $0 == "default_permissions" }.count == 1)
    }
}
