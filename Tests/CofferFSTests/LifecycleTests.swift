import CofferTestSupport
import Foundation
import Testing

/// Mounting, unmounting, signals, refusals and crash recovery.
@Suite struct LifecycleTests {
    /// As root the daemon widens the kernel's read-ahead window for its mount (docs/FILESYSTEM.md).
    @Test(.enabled(if: getuid() == 0)) func readAheadIsRaisedForTheMount() throws {
        let m = try MountFixture("coffer-fs-readahead")
        // The mount's device from util-linux, not from the daemon's own st_dev decoding.
        let device = run("/usr/bin/mountpoint", ["-d", m.mountPoint]).out.trimmingCharacters(
            in: .whitespacesAndNewlines)
        #expect(device.contains(":"), "mountpoint -d said \(device)")
        let path = "/sys/class/bdi/\(device)/read_ahead_kb"
        let value = {
            (try? String(contentsOfFile: path, encoding: .utf8)).flatMap {
                Int($0.trimmingCharacters(in: .whitespacesAndNewlines))
            }
        }
        #expect(
            eventually(timeout: 5) { (value() ?? 0) >= 4096 },
            "read_ahead_kb is \(value().map(String.init) ?? "unreadable")")
        // The log line follows the write on the daemon's thread: wait for it too.
        #expect(eventually(timeout: 5) { m.log.contains("read-ahead raised") })
    }

    /// `-o stats` (Coffer's own option, not passed to libfuse) logs the CPU time of each
    /// operation at unmount; without it nothing is measured.
    @Test func statsOnlyWhenAskedFor() throws {
        for asked in [true, false] {
            let m = try MountFixture("coffer-fs-stats", options: asked ? ["stats"] : [])
            defer { m.tearDown() }
            #expect(writeFile(m.path("f.txt"), "measured? \(asked)") == 0)
            #expect(text(readFile(m.path("f.txt"))) == "measured? \(asked)")
            try m.unmount()
            #expect(eventually(timeout: 5) { m.log.contains("daemon exiting") })
            #expect(m.log.contains("operation CPU") == asked, "\(m.log)")
            #expect(!asked || m.log.contains("  write: 1 calls"), "\(m.log)")
        }
    }

    @Test func unmountRemountKeepsEverything() throws {
        let m = try MountFixture("coffer-fs-remount")
        let src = m.tmp.sub("src")
        try makeSourceTree(src, files: 60, seed: 21)
        #expect(run("/bin/cp", ["-a", src + "/.", m.mountPoint + "/"]).status == 0)
        #expect(setXattr(m.path("file-0.txt"), "user.k", [1, 2, 3]) == 0)
        let sums = checksums(m.mountPoint)
        let listing = statListing(m.mountPoint)
        #expect(sums == checksums(src) && sums.count == 60)
        #expect(listing == statListing(src))
        let pid = m.daemonPID
        #expect(pid != nil)

        // coffer unmount returns once the daemon is gone.
        try m.unmount()
        #expect(!m.isMounted)
        #expect(
            pid.map { MountFixture.waitForExit($0, timeout: 0.5) } == true, "daemon still running after coffer unmount")
        #expect(((try? FileManager.default.contentsOfDirectory(atPath: m.mountPoint)) ?? ["?"]).isEmpty)
        #expect(coffer(m.dataDir, ["fsck"]).status == 0)
        try m.mount()
        #expect(checksums(m.mountPoint) == sums)
        #expect(statListing(m.mountPoint) == listing)
        #expect((try? getXattr(m.path("file-0.txt"), "user.k").get()) == [1, 2, 3])

        // fusermount3 -u works too, and the daemon exits by itself having flushed.
        #expect(writeFile(m.path("late.txt"), "written just before fusermount3 -u") == 0)
        let pid2 = m.daemonPID
        #expect(run("/bin/fusermount3", ["-u", m.mountPoint]).status == 0)
        #expect(pid2.map { MountFixture.waitForExit($0, timeout: 10) } == true)
        #expect(!m.isMounted)
        #expect(coffer(m.dataDir, ["cat", "/late.txt"]).out == "written just before fusermount3 -u")
        try m.mount()
        #expect(
            Set(checksums(m.mountPoint)) == Set(sums + [sha256line("./late.txt", "written just before fusermount3 -u")])
        )
        #expect(text(readFile(m.path("late.txt"))) == "written just before fusermount3 -u")
        #expect(m.log.contains("unmounted"))
    }

    @Test(arguments: [SIGTERM, SIGINT])
    func signalUnmountsCleanlyAndFlushes(signal: Int32) throws {
        let m = try MountFixture("coffer-fs-signal")
        let content = pseudoRandomBytes(count: 3_000_000, seed: UInt64(signal))
        #expect(writeFile(m.path("closed.bin"), content) == 0)
        // A file still open, written (the writes have reached the daemon) but never closed.
        let fd = open(m.path("open.bin"), O_WRONLY | O_CREAT | O_CLOEXEC, 0o644)
        #expect(fd >= 0)
        let tail = Array("still open when the signal came".utf8)
        #expect(write(fd, tail, tail.count) == tail.count)
        guard let pid = m.daemonPID else {
            Issue.record("no daemon pid")
            return
        }
        #expect(kill(pid, signal) == 0)
        #expect(MountFixture.waitForExit(pid, timeout: 15), "daemon did not exit on signal \(signal)")
        close(fd)
        #expect(eventually(timeout: 5) { !m.isMounted }, "still mounted after the daemon exited")
        #expect(m.log.contains("unmounted"), "\(m.log)")
        #expect(coffer(m.dataDir, ["fsck"]).status == 0)
        #expect(coffer(m.dataDir, ["cat", "/closed.bin"]).stdout == content)
        #expect(coffer(m.dataDir, ["cat", "/open.bin"]).stdout == tail, "a buffered write of a still-open file")
        try m.mount()
        #expect(readFile(m.path("closed.bin")) == content)
    }

    @Test func refusesANonEmptyMountPoint() throws {
        let m = try MountFixture("coffer-fs-nonempty", mount: false)
        #expect(writeFile(m.mountPoint + "/already-here", "x") == 0)
        let r = m.mountResult()
        #expect(r.status != 0)
        #expect(r.err.contains("not empty"), "\(r.err)")
        #expect(r.err.contains(m.mountPoint), "\(r.err)")
        #expect(!m.isMounted)
        #expect(m.daemonPID == nil)
        // A missing mount point, and a file as mount point, are refused too.
        let missing = m.mountResult(at: m.tmp.path + "/nope")
        #expect(missing.status != 0 && missing.err.contains("does not exist"), "\(missing.err)")
        let file = m.mountResult(at: m.mountPoint + "/already-here")
        #expect(file.status != 0 && file.err.contains("not a folder"), "\(file.err)")
        // Emptied, it mounts.
        #expect(unlink(m.mountPoint + "/already-here") == 0)
        try m.mount()
        #expect(m.isMounted)
    }

    /// The daemon keeps none of its caller's descriptors: a script that ran `coffer mount` with
    /// a file open (here fd 7, as `exec 7<file` leaves it) must not find that file held for as
    /// long as the mount lives.
    @Test func theDaemonKeepsNoDescriptorOfItsCaller() throws {
        let m = try MountFixture("coffer-fs-fds", mount: false)
        let marker = m.tmp.path + "/held-by-the-caller"
        #expect(writeFile(marker, "x") == 0)
        let mounted = run(
            "/bin/sh", ["-c", "exec 7<\"$0\"; exec \"$1\" mount \"$2\"", marker, cofferBinary, m.mountPoint],
            environment: ["COFFER_DATA_DIR": m.dataDir])
        #expect(mounted.status == 0, "\(mounted.err)")
        let pid = try #require(m.daemonPID)
        let fdDir = "/proc/\(pid)/fd"
        let targets = try FileManager.default.contentsOfDirectory(atPath: fdDir).compactMap {
            try? FileManager.default.destinationOfSymbolicLink(atPath: fdDir + "/" + $0)
        }
        #expect(!targets.isEmpty, "the daemon's descriptors are readable")
        #expect(targets.contains { $0.hasSuffix("/coffer.log") }, "\(targets)")
        #expect(!targets.contains(marker), "\(targets)")
        // The readiness pipe, moved to fd 3, still worked: mount returned once the mount was up.
        #expect(m.isMounted)
    }

    @Test func refusesASecondDaemonOnTheSameStore() throws {
        let m = try MountFixture("coffer-fs-second")
        #expect(writeFile(m.path("f"), "one") == 0)
        let other = m.tmp.sub("other")
        let r = m.mountResult(at: other)
        #expect(r.status != 0)
        #expect(r.err.contains("already serving"), "\(r.err)")
        #expect(!MountFixture.isMounted(other))
        // Mounting again at the same point is refused too, and the first mount is unharmed.
        let again = m.mountResult()
        #expect(again.status != 0 && !again.err.isEmpty, "\(again.err)")
        #expect(text(readFile(m.path("f"))) == "one")
        #expect(m.isMounted)
    }

    @Test func staleMountOfAKilledDaemonIsCleanedUp() throws {
        let m = try MountFixture("coffer-fs-stale")
        // Only fsynced data is promised across a crash (the daemon commits in groups).
        #expect(writeFile(m.path("f"), Array("survives".utf8), fsync: true) == 0)
        guard let pid = m.daemonPID else {
            Issue.record("no daemon pid")
            return
        }
        #expect(kill(pid, SIGKILL) == 0)
        #expect(MountFixture.waitForExit(pid, timeout: 10))
        var st = stat()
        let rc = stat(m.mountPoint, &st)
        let err = errno
        // A dead mount answers ENOTCONN (or, from the kernel's attribute cache, still succeeds
        // for a moment); either way it is still listed as a mount.
        #expect(rc == 0 || err == ENOTCONN || err == ECONNABORTED, "stat of a dead mount: rc \(rc) errno \(err)")
        #expect(m.isMounted)
        try m.mount()
        #expect(m.isMounted)
        #expect(stat(m.mountPoint, &st) == 0)
        #expect(text(readFile(m.path("f"))) == "survives")
        #expect(m.log.contains("stale mount"))
        // Exactly one mount there now.
        let text = (try? String(contentsOfFile: "/proc/self/mountinfo", encoding: .utf8)) ?? ""
        #expect(
            text.split(separator: "\n").filter {
                $0.split(separator: " ").count > 4 && $0.split(separator: " ")[4] == m.mountPoint
            }.count == 1)
    }

    /// kill -9 of the daemon in the middle of a burst of small files nobody fsyncs (what untar
    /// does): their statements and chunk sealing wait in the group's queue (`docs/STORE.md`,
    /// "Deferred statements"), and a crash must lose a suffix of whole operations, nothing
    /// else. After it `coffer fsck` is clean and the files are f-0 ... f-(k-1) with their exact
    /// content, then perhaps f-k empty (created, its close not yet committed), and nothing more.
    @Test func killDuringABurstLosesOnlyASuffixOfWholeOperations() throws {
        let m = try MountFixture("coffer-fs-kill9-burst")
        let progress = m.tmp.path + "/progress"
        let writer = spawn(
            python,
            [
                "-c",
                """
                import os, sys, random
                root, progress = sys.argv[1], sys.argv[2]
                i = 0
                try:
                    while True:
                        data = random.Random(i).randbytes(random.Random(-i).randint(1, 20_000))
                        with open(f'{root}/f-{i}', 'wb') as f: f.write(data)
                        i += 1
                        if i % 50 == 0:
                            with open(progress, 'w') as p: p.write(str(i))
                except OSError as e:
                    print('stopped by', e)
                """, m.mountPoint, progress,
            ])
        // Two seconds of burst: several groups commit (a burst's group closes after 0.5 s) and
        // one is open at the kill.
        let started = Date()
        let enough = eventually(timeout: 60, interval: 0.02) {
            (Int((try? String(contentsOfFile: progress, encoding: .utf8)) ?? "") ?? 0) >= 400
                && Date().timeIntervalSince(started) >= 2
        }
        #expect(enough, "the writer made too little progress")
        guard killDaemon(of: m, thenStop: writer) else { return }

        let fsck = coffer(m.dataDir, ["fsck"])
        #expect(fsck.status == 0, "fsck after kill -9 mid-burst: \(fsck.out)\(fsck.err)")
        try m.mount()
        let verify = py(
            """
            import os, sys, random
            root = sys.argv[1]
            names = [n for n in os.listdir(root) if n.startswith('f-')]
            present = sorted(int(n[2:]) for n in names)
            k = len(present)
            bad = []
            if k == 0: bad.append('nothing survived: no group committed during the burst')
            if present != list(range(k)): bad.append(f'not a prefix: {present[:3]}...{present[-3:]}')
            for i in present:
                got = open(f'{root}/f-{i}', 'rb').read()
                want = random.Random(i).randbytes(random.Random(-i).randint(1, 20_000))
                if got != want and not (got == b'' and i == k - 1):
                    bad.append(f'f-{i}: {len(got)} bytes, wanted {len(want)}')
            print(k, 'OK' if not bad else bad[:5])
            """, [m.mountPoint])
        #expect(verify.status == 0, "\(verify.err)")
        #expect(verify.out.hasSuffix(" OK\n"), "\(verify.out)")
        print("kill -9 mid-burst: \(verify.out.split(separator: " ").first ?? "?") files survived")
    }

    /// kill -9 of the daemon while a program writes and fsyncs files: afterwards `coffer fsck`
    /// is clean and every byte whose fsync returned is there.
    @Test func killDuringWritesKeepsEveryFsyncedByte() throws {
        let m = try MountFixture("coffer-fs-kill9")
        let record = m.tmp.path + "/record"
        let writer = spawn(
            python,
            [
                "-c",
                """
                import os, sys, random
                root, record = sys.argv[1], sys.argv[2]
                rec = os.open(record, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                log = os.open(root + '/log.bin', os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                def put(fd, data):
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view):]
                logsize, i = 0, 0
                try:
                    while True:
                        data = random.Random(i).randbytes(random.Random(-i).randint(1, 700_000))
                        fd = os.open(f'{root}/f-{i}', os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                        put(fd, data)
                        os.fsync(fd)
                        put(rec, f'file {i} {len(data)}\\n'.encode()); os.fsync(rec)
                        os.close(fd)
                        chunk = random.Random(10_000_000 + i).randbytes(1 + (i * 7919) % 20_000)
                        put(log, chunk)
                        os.fsync(log)
                        logsize += len(chunk)
                        put(rec, f'log {i} {logsize}\\n'.encode()); os.fsync(rec)
                        i += 1
                except OSError as e:
                    print('stopped by', e)
                """, m.mountPoint, record,
            ])
        // Let a good number of fsyncs complete, then kill the daemon mid-stream.
        let enough = eventually(timeout: 60, interval: 0.02) {
            ((try? String(contentsOfFile: record, encoding: .utf8)) ?? "").split(separator: "\n").count >= 60
        }
        #expect(enough, "the writer made too little progress")
        guard killDaemon(of: m, thenStop: writer) else { return }
        let lines = ((try? String(contentsOfFile: record, encoding: .utf8)) ?? "").split(separator: "\n")
        let files = lines.filter { $0.hasPrefix("file ") }.count
        print("kill -9 during writes: \(files) files fsynced before the kill")

        let fsck = coffer(m.dataDir, ["fsck"])
        #expect(fsck.status == 0, "fsck after kill -9: \(fsck.out)\(fsck.err)")
        try m.mount()  // also cleans the stale mount
        let verify = py(
            """
            import sys, random
            root, record = sys.argv[1], sys.argv[2]
            bad, files, logsize = [], 0, 0
            for line in open(record):
                parts = line.split()
                if len(parts) != 3: continue
                kind, i, n = parts[0], int(parts[1]), int(parts[2])
                if kind == 'file':
                    files += 1
                    want = random.Random(i).randbytes(random.Random(-i).randint(1, 700_000))
                    try: got = open(f'{root}/f-{i}', 'rb').read()
                    except OSError as e: bad.append(f'f-{i}: {e}'); continue
                    if got != want: bad.append(f'f-{i}: {len(got)} bytes, wanted {len(want)}')
                else:
                    logsize = n
            want = b''
            i = 0
            while len(want) < logsize:
                want += random.Random(10_000_000 + i).randbytes(1 + (i * 7919) % 20_000); i += 1
            got = open(root + '/log.bin', 'rb').read()
            if got[:logsize] != want[:logsize]:
                bad.append(f'log.bin: first {logsize} bytes differ ({len(got)} bytes there)')
            print(files, logsize, 'OK' if not bad else bad[:5])
            """, [m.mountPoint, record])
        #expect(verify.status == 0, "\(verify.err)")
        #expect(verify.out.hasSuffix(" OK\n"), "\(verify.out)")
        #expect(coffer(m.dataDir, ["fsck"]).status == 0)
    }
}

func sha256line(_ name: String, _ content: String) -> String { sha256(Array(content.utf8)) + "  " + name }

/// kill -9 of a mount's daemon while `writer` works on it, then of the writer. False (and the
/// test fails) if the mount has no daemon.
private func killDaemon(of m: MountFixture, thenStop writer: Child) -> Bool {
    guard let pid = m.daemonPID else {
        Issue.record("no daemon pid")
        writer.kill(SIGKILL)
        _ = writer.wait()
        return false
    }
    #expect(kill(pid, SIGKILL) == 0)
    #expect(MountFixture.waitForExit(pid, timeout: 10))
    writer.kill(SIGKILL)
    _ = writer.wait()
    return true
}
