import CofferTestSupport
import Foundation
import Testing

/// utimensat's special nanosecond values (macros Swift does not import).
let UTIME_NOW_NS = (1 << 30) - 1
let UTIME_OMIT_NS = (1 << 30) - 2

/// The pjdfstest utimensat and rename/24 cases: atime is stored apart from mtime, and a folder's
/// link count is 2 + its subfolders.
@Suite struct TimesAndLinkCountTests {
    func stamps(_ path: String) -> String {
        run("/usr/bin/stat", ["-c", "%X %Y", path]).out.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    func setTimes(_ path: String, atime: (Int, Int), mtime: (Int, Int), flags: Int32 = 0) -> Int32 {
        var times = [timespec(tv_sec: atime.0, tv_nsec: atime.1), timespec(tv_sec: mtime.0, tv_nsec: mtime.1)]
        return errnoOf { utimensat(AT_FDCWD, path, &times, flags) }
    }

    @Test func atimeIsStoredApartFromMtime() throws {
        let m = try MountFixture("coffer-fs-atime")
        let f = m.path("f")
        #expect(writeFile(f, "data") == 0)
        let created = statOf(f)
        // Created, then written: atime stays at the creation, mtime moves to the write.
        #expect(created.map { abs(Int($0.st_atim.tv_sec) - time(nil)) <= 5 } == true)
        #expect(
            created.map { ($0.st_atim.tv_sec, $0.st_atim.tv_nsec) <= ($0.st_mtim.tv_sec, $0.st_mtim.tv_nsec) } == true)

        // touch -a and touch -m each leave the other time alone (UTIME_OMIT).
        #expect(
            sh("touch -a -d @1900000000 \"$0\" && touch -m -d @1950000000 \"$0\"", environment: [:], dir: f).status == 0
        )
        #expect(stamps(f) == "1900000000 1950000000")
        #expect(sh("touch -a -d @1800000000 \"$0\"", environment: [:], dir: f).status == 0)
        #expect(stamps(f) == "1800000000 1950000000")

        // Nanoseconds, and seconds past 2^31.
        #expect(setTimes(f, atime: (2_147_483_648, 100_000_000), mtime: (0, UTIME_OMIT_NS)) == 0)
        let st = statOf(f)
        #expect(st?.st_atim.tv_sec == 2_147_483_648 && st?.st_atim.tv_nsec == 100_000_000)
        #expect(st?.st_mtim.tv_sec == 1_950_000_000 && st?.st_mtim.tv_nsec == 0)
        #expect(
            run("/usr/bin/stat", ["-c", "%x", f], environment: ["TZ": "UTC"]).out.hasPrefix(
                "2038-01-19 03:14:08.100000000"))

        // Reads do not move it (noatime).
        #expect(text(readFile(f)) == "data")
        #expect(statOf(f)?.st_atim.tv_sec == 2_147_483_648)

        // Setting the value it already has commits nothing: ctime stays, to the nanosecond.
        let before = statOf(f)
        #expect(setTimes(f, atime: (2_147_483_648, 100_000_000), mtime: (0, UTIME_OMIT_NS)) == 0)
        let same = statOf(f)
        #expect(same?.st_ctim.tv_sec == before?.st_ctim.tv_sec && same?.st_ctim.tv_nsec == before?.st_ctim.tv_nsec)

        // UTIME_NOW for atime only; `touch` (both now) gives equal times.
        let now = time(nil)
        #expect(setTimes(f, atime: (0, UTIME_NOW_NS), mtime: (0, UTIME_OMIT_NS)) == 0)
        #expect(statOf(f).map { abs(Int($0.st_atim.tv_sec) - now) <= 5 && $0.st_mtim.tv_sec == 1_950_000_000 } == true)
        #expect(writeFile(m.path("g"), "g") == 0)
        #expect(run("/usr/bin/touch", [m.path("g")]).status == 0)
        let g = statOf(m.path("g"))
        #expect(g.map { $0.st_atim.tv_sec == $0.st_mtim.tv_sec && $0.st_atim.tv_nsec == $0.st_mtim.tv_nsec } == true)

        // A symlink's own times (AT_SYMLINK_NOFOLLOW), not its target's.
        #expect(symlink("f", m.path("l")) == 0)
        #expect(
            setTimes(m.path("l"), atime: (1_000_000_001, 1), mtime: (1_000_000_002, 2), flags: AT_SYMLINK_NOFOLLOW) == 0
        )
        let l = lstatOf(m.path("l"))
        #expect(l?.st_atim.tv_sec == 1_000_000_001 && l?.st_atim.tv_nsec == 1)
        #expect(l?.st_mtim.tv_sec == 1_000_000_002 && l?.st_mtim.tv_nsec == 2)
        #expect(statOf(m.path("l"))?.st_mtim.tv_sec == 1_950_000_000)

        // Folders too.
        #expect(mkdir(m.path("d"), 0o755) == 0)
        #expect(setTimes(m.path("d"), atime: (1_234_567_890, 5), mtime: (0, UTIME_OMIT_NS)) == 0)
        #expect(statOf(m.path("d"))?.st_atim.tv_sec == 1_234_567_890)

        // futimens on a file with unwritten data (cp -p, rsync): the mtime rides with the
        // content commit at close, the atime is kept as well.
        let fd = open(m.path("copied"), O_WRONLY | O_CREAT | O_CLOEXEC, 0o644)
        #expect(fd >= 0)
        #expect(write(fd, "copied", 6) == 6)
        var times = [timespec(tv_sec: 1_100_000_000, tv_nsec: 7), timespec(tv_sec: 1_200_000_000, tv_nsec: 8)]
        #expect(futimens(fd, &times) == 0)
        #expect(close(fd) == 0)
        let c = statOf(m.path("copied"))
        #expect(c?.st_atim.tv_sec == 1_100_000_000 && c?.st_atim.tv_nsec == 7)
        #expect(c?.st_mtim.tv_sec == 1_200_000_000 && c?.st_mtim.tv_nsec == 8)
        #expect(c?.st_size == 6)

        // Times before the epoch ride along exactly; times past what the pending fields hold
        // (after 2262: a kernel's time is any 64-bit second) are committed at once instead. The
        // second trapped the daemon, and the first came back with a negative nanosecond.
        for (name, at, mt) in [
            ("early", (-300_000_000, 5), (-1, 999_999_999)), ("far", (40_000_000_000, 1), (-40_000_000_000, 2)),
        ] {
            let fd = open(m.path(name), O_WRONLY | O_CREAT | O_CLOEXEC, 0o644)
            #expect(fd >= 0)
            #expect(write(fd, "copied", 6) == 6)
            var times = [timespec(tv_sec: at.0, tv_nsec: at.1), timespec(tv_sec: mt.0, tv_nsec: mt.1)]
            #expect(futimens(fd, &times) == 0)
            #expect(close(fd) == 0)
            let s = statOf(m.path(name))
            #expect(s.map { ($0.st_atim.tv_sec, $0.st_atim.tv_nsec) } ?? (0, 0) == at, "\(name)")
            #expect(s.map { ($0.st_mtim.tv_sec, $0.st_mtim.tv_nsec) } ?? (0, 0) == mt, "\(name)")
            #expect(s?.st_size == 6)
        }

        // An atime set on its own after both times were set to ride along wins over the one
        // riding along (the earlier set's atime came back at close, also in the reply to touch).
        do {
            let fd = open(m.path("later"), O_WRONLY | O_CREAT | O_CLOEXEC, 0o644)
            #expect(fd >= 0)
            #expect(write(fd, "copied", 6) == 6)
            var times = [timespec(tv_sec: 1_100_000_000, tv_nsec: 0), timespec(tv_sec: 1_200_000_000, tv_nsec: 0)]
            #expect(futimens(fd, &times) == 0)
            #expect(setTimes(m.path("later"), atime: (1_300_000_000, 0), mtime: (0, UTIME_OMIT_NS)) == 0)
            #expect(statOf(m.path("later"))?.st_atim.tv_sec == 1_300_000_000)
            #expect(close(fd) == 0)
            #expect(stamps(m.path("later")) == "1300000000 1200000000")
        }

        // Stored: the same after a remount.
        let format = "%n %X %Y %x %y"
        let listing = statListing(m.mountPoint, format: format)
        try m.unmount()
        try m.mount()
        #expect(statListing(m.mountPoint, format: format) == listing)
        #expect(statOf(m.path("copied"))?.st_atim.tv_nsec == 7 && lstatOf(m.path("l"))?.st_atim.tv_nsec == 1)
    }

    /// ctime is when the file last changed: not its mtime (which `touch -d` sets anywhere, also
    /// into the future) and not when the change was committed (at close), as on ext4. Found by
    /// a differential run against ext4.
    @Test func ctimeIsTheTimeOfTheChange() throws {
        let m = try MountFixture("coffer-fs-ctime")
        func ctimeNs(_ path: String) -> Int? {
            statOf(path).map { Int($0.st_ctim.tv_sec) * 1_000_000_000 + Int($0.st_ctim.tv_nsec) }
        }
        func nowNs() -> Int {
            var t = timespec()
            clock_gettime(CLOCK_REALTIME, &t)
            return t.tv_sec * 1_000_000_000 + t.tv_nsec
        }
        let future = 4_102_444_800  // 2100-01-01
        // A time set into the future moves mtime only.
        #expect(writeFile(m.path("f"), "data") == 0)
        #expect(setTimes(m.path("f"), atime: (future, 0), mtime: (future, 0)) == 0)
        let f = try #require(statOf(m.path("f")))
        #expect(f.st_mtim.tv_sec == future)
        #expect(abs(f.st_ctim.tv_sec - time(nil)) <= 5, "ctime \(f.st_ctim.tv_sec)")
        // The same through futimens while writes are unflushed (they commit together at close).
        let fd = open(m.path("g"), O_WRONLY | O_CREAT | O_CLOEXEC, 0o644)
        #expect(fd >= 0)
        let beforeWrite = nowNs()
        #expect(write(fd, "written", 7) == 7)
        var times = [timespec(tv_sec: future, tv_nsec: 0), timespec(tv_sec: future, tv_nsec: 0)]
        #expect(futimens(fd, &times) == 0)
        let afterChanges = nowNs()
        let whileOpen = try #require(ctimeNs(m.path("g")))
        #expect(whileOpen >= beforeWrite - 10_000_000 && whileOpen <= afterChanges + 10_000_000)
        // Closed a while later: ctime stays the time of the changes, not of the close.
        usleep(600_000)
        #expect(close(fd) == 0)
        let closed = try #require(ctimeNs(m.path("g")))
        #expect(closed == whileOpen, "ctime \(closed) against \(whileOpen) before the close")
        #expect(statOf(m.path("g"))?.st_mtim.tv_sec == future)
        // Stored: the same after a remount.
        let fBefore = ctimeNs(m.path("f"))
        try m.unmount()
        try m.mount()
        #expect(ctimeNs(m.path("g")) == closed)
        #expect(ctimeNs(m.path("f")) == fBefore)
    }

    func links(_ path: String) -> Int? { statOf(path).map { Int($0.st_nlink) } }

    @Test func folderLinkCountIsTwoPlusSubfolders() throws {
        let m = try MountFixture("coffer-fs-nlink")
        for d in ["a", "b", "a/x", "a/y"] { #expect(mkdir(m.path(d), 0o755) == 0) }
        #expect(writeFile(m.path("a/file"), "f") == 0)
        #expect(symlink("file", m.path("a/link")) == 0)
        #expect(links(m.mountPoint) == 4)
        #expect(links(m.path("a")) == 4, "x and y; the file and the symlink do not count")
        #expect(links(m.path("b")) == 2)
        #expect(links(m.path("a/x")) == 2)
        #expect(links(m.path("a/file")) == 1 && lstatOf(m.path("a/link"))?.st_nlink == 1)

        // pjdfstest rename/24: a folder moved between parents.
        #expect(rename(m.path("a/x"), m.path("b/x")) == 0)
        #expect(links(m.path("a")) == 3 && links(m.path("b")) == 3)
        #expect(run("/usr/bin/mv", [m.path("a/y"), m.path("b/y")]).status == 0)
        #expect(links(m.path("a")) == 2 && links(m.path("b")) == 4)
        #expect(rmdir(m.path("b/x")) == 0)
        #expect(links(m.path("b")) == 3)
        // A folder replacing an empty one keeps the count.
        #expect(mkdir(m.path("a/y"), 0o755) == 0)
        #expect(rename(m.path("b/y"), m.path("a/y")) == 0)
        #expect(links(m.path("a")) == 3 && links(m.path("b")) == 2)

        // Listings (readdirplus) report the same; `find` relies on it to skip leaves.
        let ls = run("/usr/bin/ls", ["-l", m.mountPoint]).out
        let counts = ls.split(separator: "\n").filter { $0.hasPrefix("d") }.map {
            $0.split(separator: " ", omittingEmptySubsequences: true)[1]
        }
        #expect(counts == ["3", "2"], "\(ls)")
        let found = run("/usr/bin/find", [m.mountPoint, "-type", "d"]).out.split(separator: "\n").count
        #expect(found == 4)

        // A folder made or removed by another process (the CLI) shows once the watcher told the
        // kernel. The mount's last commits may still sit in its open group transaction, which
        // other processes see only once it closes: retried until the CLI sees b/.
        #expect(eventually(timeout: 3.0, interval: 0.1) { coffer(m.dataDir, ["mkdir", "/b/z"]).status == 0 })
        #expect(eventually(timeout: 2.0) { links(m.path("b")) == 3 })
        #expect(coffer(m.dataDir, ["rm", "-r", "/a"]).status == 0)
        #expect(eventually(timeout: 2.0) { links(m.mountPoint) == 3 })

        try m.unmount()
        try m.mount()
        #expect(links(m.mountPoint) == 3 && links(m.path("b")) == 3 && links(m.path("b/z")) == 2)
    }
}
