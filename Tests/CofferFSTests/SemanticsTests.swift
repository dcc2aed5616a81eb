import CofferTestSupport
import Foundation
import Testing

/// Each semantic the issue lists, on a real mount.
@Suite struct SemanticsTests {
    @Test func renameOverOpenFileIsAtomicReplace() throws {
        let m = try MountFixture("coffer-fs-rename")
        let t = m.path("target.txt")
        #expect(writeFile(t, "OLD content") == 0)
        let held = open(t, O_RDONLY | O_CLOEXEC)
        #expect(held >= 0)
        defer { close(held) }
        #expect(text(readAll(fd: held)) == "OLD content")
        #expect(writeFile(m.path("tmp.txt"), "NEW content, longer") == 0)
        let before = statOf(t)
        #expect(rename(m.path("tmp.txt"), t) == 0)
        // The held descriptor still reads the old file; a new open reads the new one.
        #expect(text(readAll(fd: held)) == "OLD content")
        #expect(text(readFile(t)) == "NEW content, longer")
        #expect(lstatOf(m.path("tmp.txt")) == nil)
        var st = stat()
        #expect(fstat(held, &st) == 0)
        #expect(st.st_nlink == 0, "the replaced file has no name left")
        #expect(statOf(t)?.st_ino != before?.st_ino)
        let names = (try? FileManager.default.contentsOfDirectory(atPath: m.mountPoint)) ?? []
        #expect(names == ["target.txt"])

        // Atomic: a reader opening the name in a loop never misses it nor sees a mix.
        let a = [UInt8](repeating: 0x41, count: 300_000)
        let b = [UInt8](repeating: 0x42, count: 200_000)
        #expect(writeFile(t, a) == 0)
        let stop = Atomicish()
        let failures = Atomicish()
        let wholeReads = Atomicish()
        let reader = Thread {
            while !stop.isSet {
                // Which call failed, and how, is what tells a lookup race from a read race.
                let fd = open(t, O_RDONLY | O_CLOEXEC)
                guard fd >= 0 else {
                    failures.add("open failed: errno \(errno)")
                    continue
                }
                let bytes = readAll(fd: fd)
                let readErrno = errno
                close(fd)
                guard let bytes else {
                    failures.add("read failed: errno \(readErrno)")
                    continue
                }
                if bytes != a && bytes != b {
                    failures.add("mixed content of \(bytes.count) bytes")
                } else {
                    wholeReads.count()
                }
            }
            stop.add("done")
        }
        reader.start()
        // The renames start once the reader reads, and it must keep reading through them: a
        // reader that never got a file through proves nothing.
        #expect(eventually(timeout: 10, interval: 0.001) { wholeReads.counted > 0 }, "the reader read nothing")
        let readsBefore = wholeReads.counted
        for i in 0..<40 {
            let tmp = m.path("next-\(i)")
            #expect(writeFile(tmp, i % 2 == 0 ? b : a) == 0)
            #expect(rename(tmp, t) == 0)
        }
        let readsDuring = wholeReads.counted - readsBefore
        stop.set()
        #expect(eventually(timeout: 10) { stop.items.contains("done") })
        #expect(failures.items.isEmpty, "\(failures.items.prefix(5))")
        #expect(readsDuring > 0, "the reader read nothing while the file was renamed over")
    }

    @Test func renameNoReplaceAndExchange() throws {
        let m = try MountFixture("coffer-fs-rename2")
        let r = m.mountPoint
        #expect(writeFile(r + "/a", "AAA") == 0)
        #expect(writeFile(r + "/b", "BB") == 0)
        #expect(mkdir(r + "/dir", 0o755) == 0)
        #expect(writeFile(r + "/dir/in", "inside") == 0)

        // NOREPLACE: refused onto an existing name, both untouched; fine onto a free name.
        #expect(errnoOf { renameat2(r + "/a", r + "/b", flags: RENAME_NOREPLACE_FLAG) } == EEXIST)
        #expect(text(readFile(r + "/a")) == "AAA" && text(readFile(r + "/b")) == "BB")
        #expect(renameat2(r + "/a", r + "/c", flags: RENAME_NOREPLACE_FLAG) == 0)
        #expect(lstatOf(r + "/a") == nil && text(readFile(r + "/c")) == "AAA")

        // EXCHANGE: two files swap; a file and a folder swap; both names stay.
        let inoC = statOf(r + "/c")?.st_ino
        let inoB = statOf(r + "/b")?.st_ino
        #expect(renameat2(r + "/c", r + "/b", flags: RENAME_EXCHANGE_FLAG) == 0)
        #expect(text(readFile(r + "/c")) == "BB" && text(readFile(r + "/b")) == "AAA")
        #expect(statOf(r + "/b")?.st_ino == inoC && statOf(r + "/c")?.st_ino == inoB)
        #expect(renameat2(r + "/c", r + "/dir", flags: RENAME_EXCHANGE_FLAG) == 0)
        #expect(text(readFile(r + "/dir")) == "BB")
        #expect(text(readFile(r + "/c/in")) == "inside")
        // Across folders, and both flags at once is invalid.
        #expect(renameat2(r + "/dir", r + "/c/in", flags: RENAME_EXCHANGE_FLAG) == 0)
        #expect(text(readFile(r + "/dir")) == "inside" && text(readFile(r + "/c/in")) == "BB")
        #expect(
            errnoOf { renameat2(r + "/b", r + "/dir", flags: RENAME_EXCHANGE_FLAG | RENAME_NOREPLACE_FLAG) } == EINVAL)
        // The store agrees (through the CLI, while mounted, once the daemon's group commits).
        #expect(eventually(timeout: 1.0) { coffer(m.dataDir, ["cat", "/c/in"]).out == "BB" })
        #expect(eventually(timeout: 1.0) { coffer(m.dataDir, ["cat", "/b"]).out == "AAA" })
    }

    @Test func unlinkedOpenFileStaysReadableAndWritable() throws {
        let m = try MountFixture("coffer-fs-unlinked")
        let p = m.path("doomed")
        let fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0o644)
        #expect(fd >= 0)
        #expect(write(fd, "hello", 5) == 5)
        let reader = open(p, O_RDONLY | O_CLOEXEC)
        #expect(reader >= 0)
        #expect(unlink(p) == 0)
        #expect(lstatOf(p) == nil)
        #expect(openErrno(p, O_RDONLY) == ENOENT)
        var st = stat()
        #expect(fstat(fd, &st) == 0)
        #expect(st.st_nlink == 0)
        #expect(st.st_size == 5)
        #expect(text(readAll(fd: fd)) == "hello")
        #expect(pwrite(fd, " world", 6, 5) == 6)
        #expect(text(readAll(fd: fd)) == "hello world")
        #expect(text(readAll(fd: reader)) == "hello world", "another descriptor sees the writes")
        #expect(fstat(fd, &st) == 0 && st.st_size == 11 && st.st_nlink == 0)
        #expect(ftruncate(fd, 4) == 0)
        #expect(text(readAll(fd: reader)) == "hell")
        // Its attributes still change through a descriptor, as on ext4: a write moves mtime,
        // fchmod, fchown and futimens take effect.
        var before = stat()
        #expect(fstat(fd, &before) == 0)
        usleep(20_000)
        #expect(pwrite(fd, "!", 1, 4) == 1)
        #expect(fstat(fd, &st) == 0)
        #expect((st.st_mtim.tv_sec, st.st_mtim.tv_nsec) > (before.st_mtim.tv_sec, before.st_mtim.tv_nsec))
        #expect(fchmod(fd, 0o600) == 0 && fchown(fd, 1000, 1000) == 0)
        var times = [timespec(tv_sec: 1_000_000_000, tv_nsec: 0), timespec(tv_sec: 1_000_000_000, tv_nsec: 0)]
        #expect(futimens(fd, &times) == 0)
        #expect(fstat(fd, &st) == 0)
        #expect(st.st_mode & 0o7777 == 0o600 && st.st_uid == 1000 && st.st_gid == 1000)
        #expect(st.st_mtim.tv_sec == 1_000_000_000 && st.st_size == 5)
        #expect(fstat(reader, &st) == 0 && st.st_mode & 0o7777 == 0o600, "the other descriptor sees it")
        // And its xattrs, with a live file's errnos (through /proc's links to the descriptors).
        let viaFD = "/proc/self/fd/\(fd)"
        let viaReader = "/proc/self/fd/\(reader)"
        #expect(setXattr(viaFD, "user.k", [7]) == 0)
        #expect(getXattr(viaReader, "user.k") == .success([7]))
        // Flags 2 and 1: XATTR_REPLACE and XATTR_CREATE.
        #expect(errnoOf { setXattr(viaFD, "user.missing", [1], flags: 2) } == ENODATA)
        #expect(errnoOf { setXattr(viaFD, "user.k", [1], flags: 1) } == EEXIST)
        #expect(removeXattr(viaFD, "user.k") == 0)
        #expect(getXattr(viaFD, "user.k") == .failure(POSIXErrorBox(code: ENODATA)))
        #expect(close(fd) == 0)
        #expect(text(readAll(fd: reader)) == "hell!", "readable until the last close")
        #expect(close(reader) == 0)
        // A new file under the same name is a different, empty file; nothing is left over.
        #expect(writeFile(p, "new") == 0)
        #expect(text(readFile(p)) == "new")
        #expect(((try? FileManager.default.contentsOfDirectory(atPath: m.mountPoint)) ?? []) == ["doomed"])
        let fsck = coffer(m.dataDir, ["fsck"])
        #expect(fsck.status == 0, "\(fsck.out)\(fsck.err)")
    }

    /// A removed folder that a process still holds (its working directory, an open descriptor)
    /// answers fstat with no links, as on ext4, and nothing can be created in it.
    @Test func removedFolderStillAnswersFstat() throws {
        let m = try MountFixture("coffer-fs-rmdir-open")
        #expect(mkdir(m.path("gone"), 0o750) == 0)
        #expect(mkdir(m.path("replaced"), 0o750) == 0)
        #expect(mkdir(m.path("other"), 0o755) == 0)
        let gone = open(m.path("gone"), O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        let replaced = open(m.path("replaced"), O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        #expect(gone >= 0 && replaced >= 0)
        #expect(rmdir(m.path("gone")) == 0)
        #expect(rename(m.path("other"), m.path("replaced")) == 0)
        for fd in [gone, replaced] {
            var st = stat()
            #expect(fstat(fd, &st) == 0)
            #expect(st.st_mode & S_IFMT == S_IFDIR && st.st_mode & 0o7777 == 0o750 && st.st_nlink == 0)
            #expect(errnoOf { openat(fd, "new", O_WRONLY | O_CREAT | O_CLOEXEC, 0o644) } == ENOENT)
            close(fd)
        }
        #expect(lstatOf(m.path("gone")) == nil)
        #expect(statOf(m.path("replaced")).map { $0.st_mode & 0o7777 } == 0o755)
    }

    @Test func appendTruncateAndHoles() throws {
        let m = try MountFixture("coffer-fs-io")
        let p = m.path("f")
        #expect(writeFile(p, "abc") == 0)
        // O_APPEND: every write goes to the end, wherever the offset was put.
        let fd = open(p, O_WRONLY | O_APPEND | O_CLOEXEC)
        #expect(fd >= 0)
        #expect(write(fd, "def", 3) == 3)
        #expect(lseek(fd, 0, SEEK_SET) == 0)
        #expect(write(fd, "g", 1) == 1)
        #expect(pwrite(fd, "h", 1, 0) == 1)
        #expect(close(fd) == 0)
        #expect(text(readFile(p)) == "abcdefgh")
        // O_TRUNC empties it.
        let t = open(p, O_WRONLY | O_TRUNC | O_CLOEXEC)
        #expect(t >= 0)
        #expect(statOf(p)?.st_size == 0)
        close(t)
        #expect(readFile(p) == [])
        // Also with O_RDONLY, as Linux does (write permission is still checked), and it stays.
        #expect(writeFile(p, "abc") == 0)
        let r = open(p, O_RDONLY | O_TRUNC | O_CLOEXEC)
        #expect(r >= 0)
        #expect(statOf(p)?.st_size == 0)
        close(r)
        #expect(readFile(p) == [])
        // O_TRUNC of a file that is empty already still marks mtime and ctime (POSIX), and so do
        // a truncate to the size it has and a fallocate inside it (Linux).
        var times = [timespec(tv_sec: 1_000_000_000, tv_nsec: 0), timespec(tv_sec: 1_000_000_000, tv_nsec: 0)]
        func markedNow() -> Bool { statOf(p).map { abs(Int($0.st_mtim.tv_sec) - time(nil)) <= 5 } == true }
        #expect(utimensat(AT_FDCWD, p, &times, 0) == 0)
        let e = open(p, O_WRONLY | O_TRUNC | O_CLOEXEC)
        #expect(e >= 0)
        close(e)
        #expect(markedNow(), "O_TRUNC of an empty file")
        #expect(writeFile(p, "12345") == 0)
        #expect(utimensat(AT_FDCWD, p, &times, 0) == 0)
        #expect(truncate(p, 5) == 0)
        #expect(markedNow(), "truncate to the same size")
        #expect(utimensat(AT_FDCWD, p, &times, 0) == 0)
        let a = open(p, O_WRONLY | O_CLOEXEC)
        #expect(a >= 0 && posix_fallocate(a, 1, 2) == 0)
        close(a)
        #expect(markedNow(), "fallocate inside the file")
        #expect(statOf(p)?.st_size == 5 && text(readFile(p)) == "12345")
        #expect(truncate(p, 0) == 0)
        try m.unmount()
        try m.mount()
        #expect(readFile(p) == [])
        #expect(statOf(p).map { abs(Int($0.st_mtim.tv_sec) - time(nil)) <= 5 } == true)
        // truncate up reads zeros, down cuts.
        #expect(writeFile(p, "12345") == 0)
        #expect(truncate(p, 10) == 0)
        #expect(statOf(p)?.st_size == 10)
        #expect(readFile(p) == Array("12345".utf8) + [UInt8](repeating: 0, count: 5))
        #expect(truncate(p, 3) == 0)
        #expect(text(readFile(p)) == "123")
        let big = pseudoRandomBytes(count: 3_000_000, seed: 7)
        #expect(writeFile(p, big) == 0)
        #expect(truncate(p, 1_500_001) == 0)
        #expect(readFile(p) == Array(big[0..<1_500_001]))
        #expect(truncate(p, 2_000_000) == 0)
        #expect(readFile(p) == Array(big[0..<1_500_001]) + [UInt8](repeating: 0, count: 499_999))
        // Writes past the end: the gap (across chunk boundaries) reads as zeros.
        let h = m.path("holes")
        let fd2 = open(h, O_RDWR | O_CREAT | O_CLOEXEC, 0o644)
        #expect(fd2 >= 0)
        #expect(pwrite(fd2, "start", 5, 0) == 5)
        let far: off_t = 9 * 1024 * 1024 + 13
        #expect(pwrite(fd2, "end", 3, far) == 3)
        var st = stat()
        #expect(fstat(fd2, &st) == 0 && st.st_size == far + 3)
        #expect(fsync(fd2) == 0)
        #expect(close(fd2) == 0)
        let back = readFile(h) ?? []
        #expect(back.count == Int(far) + 3)
        #expect(back.prefix(5) == ArraySlice(Array("start".utf8)))
        #expect(back.suffix(3) == ArraySlice(Array("end".utf8)))
        #expect(back[5..<Int(far)].allSatisfy { $0 == 0 })
        // And the same after a remount (from the store, not the page cache).
        try m.unmount()
        try m.mount()
        #expect(readFile(h) == back)
        #expect(readFile(p) == Array(big[0..<1_500_001]) + [UInt8](repeating: 0, count: 499_999))
    }

    /// pjdfstest truncate/12: a size past what Coffer holds is EFBIG, and the daemon lives on.
    /// (It once aborted trying to allocate a chunk table for 999999999999999 bytes.)
    @Test func hugeSizesAreEFBIGNotACrash() throws {
        let m = try MountFixture("coffer-fs-efbig")
        let p = m.path("f")
        #expect(writeFile(p, "small") == 0)
        #expect(errnoOf { truncate(p, 999_999_999_999_999) } == EFBIG)
        let fd = open(p, O_RDWR | O_CLOEXEC)
        #expect(fd >= 0)
        #expect(errnoOf { ftruncate(fd, 1 << 50) } == EFBIG)
        #expect(errnoOf { Int32(pwrite(fd, "x", 1, 1 << 50)) } == EFBIG)
        #expect(posix_fallocate(fd, 1 << 50, 4096) == EFBIG)
        close(fd)
        // Still mounted and answering, content untouched; a large sparse size is fine.
        #expect(text(readFile(p)) == "small")
        #expect(truncate(p, 3 << 30) == 0)
        #expect(statOf(p)?.st_size == 3 << 30)
        #expect(writeFile(m.path("after"), "alive") == 0)
        #expect(text(readFile(m.path("after"))) == "alive")
    }

    @Test func symlinks() throws {
        let m = try MountFixture("coffer-fs-symlink")
        let r = m.mountPoint
        #expect(mkdir(r + "/dir", 0o755) == 0)
        #expect(writeFile(r + "/dir/target.txt", "pointed at") == 0)
        #expect(symlink("target.txt", r + "/dir/rel") == 0)
        #expect(symlink("dir/target.txt", r + "/rel2") == 0)
        #expect(symlink(r + "/dir/target.txt", r + "/abs") == 0)
        #expect(symlink("../nowhere/at/all", r + "/dangling") == 0)
        #expect(symlink("dir", r + "/dirlink") == 0)
        func readlinkOf(_ p: String) -> String? {
            var buf = [CChar](repeating: 0, count: 4096)
            let n = readlink(p, &buf, buf.count)
            return n < 0 ? nil : String(decoding: buf[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self)
        }
        #expect(readlinkOf(r + "/dir/rel") == "target.txt")
        #expect(readlinkOf(r + "/rel2") == "dir/target.txt")
        #expect(readlinkOf(r + "/abs") == r + "/dir/target.txt")
        #expect(readlinkOf(r + "/dangling") == "../nowhere/at/all")
        for p in ["/dir/rel", "/rel2", "/abs"] { #expect(text(readFile(r + p)) == "pointed at", "\(p)") }
        #expect(text(readFile(r + "/dirlink/target.txt")) == "pointed at")
        let l = lstatOf(r + "/dangling")
        #expect(l.map { $0.st_mode & S_IFMT } == S_IFLNK)
        #expect(l?.st_size == 17)
        #expect(statOf(r + "/dangling") == nil && errno == ENOENT)
        #expect(lstatOf(r + "/abs").map { $0.st_mode & S_IFMT } == S_IFLNK)
        #expect(statOf(r + "/abs").map { $0.st_mode & S_IFMT } == S_IFREG)
        var buf = [CChar](repeating: 0, count: 64)
        #expect(errnoOf { readlink(r + "/dir/target.txt", &buf, 64) } == EINVAL)
        // Removing a link leaves its target; links survive a remount.
        #expect(unlink(r + "/rel2") == 0)
        #expect(text(readFile(r + "/dir/target.txt")) == "pointed at")
        try m.unmount()
        try m.mount()
        #expect(readlinkOf(r + "/dangling") == "../nowhere/at/all")
        #expect(readlinkOf(r + "/abs") == r + "/dir/target.txt")
        #expect(text(readFile(r + "/dir/rel")) == "pointed at")
    }

    @Test func userXattrs() throws {
        let m = try MountFixture("coffer-fs-xattr")
        let p = m.path("f")
        #expect(writeFile(p, "x") == 0)
        #expect(mkdir(m.path("d"), 0o755) == 0)
        #expect(setXattr(p, "user.color", Array("blue".utf8)) == 0)
        #expect(setXattr(p, "user.binary", [0, 1, 2, 255]) == 0)
        #expect(setXattr(m.path("d"), "user.on-folder", Array("yes".utf8)) == 0)
        #expect((try? getXattr(p, "user.color").get()) == Array("blue".utf8))
        #expect((try? getXattr(p, "user.binary").get()) == [0, 1, 2, 255])
        #expect((try? getXattr(m.path("d"), "user.on-folder").get()) == Array("yes".utf8))
        #expect(Set((try? listXattr(p).get()) ?? []) == ["user.color", "user.binary"])
        // XATTR_CREATE on an existing one, XATTR_REPLACE on a missing one.
        #expect(errnoOf { setXattr(p, "user.color", [1], flags: 1) } == EEXIST)
        #expect(errnoOf { setXattr(p, "user.missing", [1], flags: 2) } == ENODATA)
        #expect(setXattr(p, "user.color", Array("red".utf8), flags: 2) == 0)
        #expect((try? getXattr(p, "user.color").get()) == Array("red".utf8))
        #expect(removeXattr(p, "user.binary") == 0)
        #expect(getXattr(p, "user.binary") == .failure(POSIXErrorBox(code: ENODATA)))
        #expect(errnoOf { removeXattr(p, "user.binary") } == ENODATA)
        #expect((try? listXattr(p).get()) == ["user.color"])
        // Other namespaces are refused.
        let trusted = setXattr(p, "trusted.secret", [1])
        #expect(trusted != 0 && [ENOTSUP, EPERM].contains(errno), "errno \(errno)")
        let plain = setXattr(p, "noprefix", [1])
        #expect(plain != 0)
        #expect((try? listXattr(p).get()) == ["user.color"])
        // Kept across a remount.
        try m.unmount()
        try m.mount()
        #expect((try? getXattr(p, "user.color").get()) == Array("red".utf8))
        #expect((try? getXattr(m.path("d"), "user.on-folder").get()) == Array("yes".utf8))
    }

    @Test func byteRangeLocks() throws {
        let m = try MountFixture("coffer-fs-locks")
        let p = m.path("locked")
        #expect(writeFile(p, [UInt8](repeating: 1, count: 1000)) == 0)
        let marker = m.tmp.path + "/holding"
        // The holder locks bytes 0..<100 and waits for its stdin to close.
        let holder = spawn(
            python,
            [
                "-c",
                """
                import fcntl, os, sys
                f = open(sys.argv[1], 'r+b')
                fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, 100, 0)
                open(sys.argv[2], 'w').write('locked')
                sys.stdin.read()
                print('released')
                """, p, marker,
            ])
        #expect(eventually(timeout: 10) { FileManager.default.fileExists(atPath: marker) })
        let tryLock = """
            import fcntl, sys, errno
            f = open(sys.argv[1], 'r+b')
            start, length = int(sys.argv[2]), int(sys.argv[3])
            try:
                fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, length, start)
                print('OK')
            except OSError as e:
                print(errno.errorcode[e.errno])
            """
        let conflicting = py(tryLock, [p, "50", "10"]).out.trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(conflicting == "EAGAIN" || conflicting == "EACCES", "\(conflicting)")
        let whole = py(tryLock, [p, "0", "0"]).out.trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(whole == "EAGAIN" || whole == "EACCES", "\(whole)")
        #expect(py(tryLock, [p, "200", "100"]).out == "OK\n", "a range nobody holds")
        // A shared lock is refused too; after the holder lets go the range is free.
        let shared = py(
            """
            import fcntl, sys, errno
            f = open(sys.argv[1], 'rb')
            try:
                fcntl.lockf(f, fcntl.LOCK_SH | fcntl.LOCK_NB, 10, 0); print('OK')
            except OSError as e: print(errno.errorcode[e.errno])
            """, [p]
        ).out.trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(shared == "EAGAIN" || shared == "EACCES", "\(shared)")
        close(holder.stdinFD)
        let done = holder.wait()
        #expect(done.out == "released\n", "\(done.err)")
        #expect(py(tryLock, [p, "50", "10"]).out == "OK\n")
    }
}

/// A tiny thread-safe bag of strings and a flag, for the reader thread above.
final class Atomicish: @unchecked Sendable {
    private let lock = NSLock()
    private var _items: [String] = []
    private var flag = false
    private var _counted = 0
    func add(_ s: String) {
        lock.lock()
        _items.append(s)
        lock.unlock()
    }
    func count() {
        lock.lock()
        _counted += 1
        lock.unlock()
    }
    var counted: Int {
        lock.lock()
        defer { lock.unlock() }
        return _counted
    }
    var items: [String] {
        lock.lock()
        defer { lock.unlock() }
        return _items
    }
    func set() {
        lock.lock()
        flag = true
        lock.unlock()
    }
    var isSet: Bool {
        lock.lock()
        defer { lock.unlock() }
        return flag
    }
}
