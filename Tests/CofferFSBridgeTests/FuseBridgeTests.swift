import CFuse
import CFuseReader
import CofferFuse
import Foundation
import Synchronization
import Testing

#if canImport(Glibc)
    import Glibc
#endif

// Real mounts: these need /dev/fuse and permission to mount (root, or
// fusermount3 with user_allow_other unneeded since allow_other is not used).
// Serialized because process signals and mount helpers are process-global.
@Suite(.serialized)
struct FuseBridgeTests {
    static let options = ["default_permissions", "fsname=cofferbridgetest", "subtype=coffer"]

    @Test func filesDirectoriesRenameXattrsWithReaddirPlus() throws {
        let mount = try MountHarness(
            configuration: .init(
                mountOptions: Self.options, readdirPlus: .always, handleSignals: false))
        defer { mount.cleanUp() }
        try mount.start()

        let connection = try #require(mount.session.connection)
        #expect(!connection.atomicOpenTruncate)
        #expect(connection.readdirPlus)
        #expect(!connection.readdirPlusAuto)
        #expect(!connection.writebackCache)
        #expect(!connection.posixLocks)
        #expect(connection.maxWrite == 1 << 20)
        try exerciseEverything(mount)
    }

    /// What `filesDirectoriesRenameXattrsWithReaddirPlus` checks, on a started mount; ends it.
    func exerciseEverything(_ mount: MountHarness) throws {
        let fs = mount.filesystem

        // Directories and files.
        try posix("mkdir") { mkdir(mount.path("dir"), 0o755) }
        #expect(try statPath(mount.path("dir")).st_mode & Glibc.S_IFMT == Glibc.S_IFDIR)
        #expect(posixErrno { mkdir(mount.path("dir"), 0o755) } == EEXIST)

        let hello = Array("hello, world".utf8)
        try writeFile(mount.path("dir/a.txt"), hello)
        #expect(try readFile(mount.path("dir/a.txt")) == hello)
        #expect(try statPath(mount.path("dir/a.txt")).st_size == hello.count)
        #expect(try FileManager.default.contentsOfDirectory(atPath: mount.path("dir")) == ["a.txt"])

        // Writes beyond the end leave a zero-filled hole.
        let fd = try posix("open") { open(mount.path("dir/a.txt"), O_WRONLY | O_CLOEXEC) }
        try posix("pwrite") { [UInt8]("!".utf8).withUnsafeBytes { pwrite(fd, $0.baseAddress, 1, 20) } }
        close(fd)
        let holed = try readFile(mount.path("dir/a.txt"))
        #expect(holed.count == 21)
        #expect(holed[12..<20].allSatisfy { $0 == 0 })

        // O_TRUNC truncates (a setattr after the open), O_APPEND appends.
        try writeFile(mount.path("dir/a.txt"), Array("abc".utf8))
        #expect(try readFile(mount.path("dir/a.txt")) == Array("abc".utf8))
        try writeFile(mount.path("dir/a.txt"), Array("def".utf8), flags: O_WRONLY | O_APPEND)
        #expect(try readFile(mount.path("dir/a.txt")) == Array("abcdef".utf8))

        // Large I/O crosses the 1 MiB request size several times.
        let big = (0..<(3 << 20) + 12345).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ $0 >> 11) }
        try writeFile(mount.path("big.bin"), big)
        #expect(try readFile(mount.path("big.bin")) == big)

        // truncate(2), chmod(2), utimensat(2) with explicit and UTIME_NOW times.
        try posix("truncate") { truncate(mount.path("big.bin"), 100) }
        #expect(try statPath(mount.path("big.bin")).st_size == 100)
        try posix("chmod") { chmod(mount.path("big.bin"), 0o600) }
        #expect(try statPath(mount.path("big.bin")).st_mode & 0o7777 == 0o600)
        var times = [
            timespec(tv_sec: 1_000_000_000, tv_nsec: 123_456_789),
            timespec(tv_sec: 1_200_000_000, tv_nsec: 987_654_321),
        ]
        try posix("utimensat") { utimensat(AT_FDCWD, mount.path("big.bin"), &times, 0) }
        var st = try statPath(mount.path("big.bin"))
        #expect(st.st_atim.tv_sec == 1_000_000_000 && st.st_atim.tv_nsec == 123_456_789)
        #expect(st.st_mtim.tv_sec == 1_200_000_000 && st.st_mtim.tv_nsec == 987_654_321)
        times[0] = timespec(tv_sec: 0, tv_nsec: Int(coffer_utime_omit()))
        times[1] = timespec(tv_sec: 0, tv_nsec: Int(coffer_utime_now()))
        try posix("utimensat now") { utimensat(AT_FDCWD, mount.path("big.bin"), &times, 0) }
        st = try statPath(mount.path("big.bin"))
        #expect(st.st_atim.tv_sec == 1_000_000_000)
        #expect(abs(st.st_mtim.tv_sec - time(nil)) < 60)

        // Many entries: listing spans several readdirplus replies, so the
        // offset cookies must resume exactly where the previous reply ended.
        try posix("mkdir many") { mkdir(mount.path("many"), 0o755) }
        let names = (0..<500).map { "entry-\($0)-" + String(repeating: "x", count: $0 % 40) }
        for name in names { try writeFile(mount.path("many/" + name), []) }
        let listed = try listDirectory(mount.path("many"))
        #expect(listed.count == names.count + 2)
        #expect(Set(listed) == Set(names + [".", ".."]))
        #expect(fs.state.withLock { $0.readdirPlusCalls } > 3)

        // rename: plain, RENAME_NOREPLACE, RENAME_EXCHANGE.
        try posix("rename") { rename(mount.path("dir/a.txt"), mount.path("dir/b.txt")) }
        #expect(posixErrno { access(mount.path("dir/a.txt"), F_OK) } == ENOENT)
        #expect(try readFile(mount.path("dir/b.txt")) == Array("abcdef".utf8))
        try writeFile(mount.path("dir/c.txt"), Array("ccc".utf8))
        #expect(
            posixErrno {
                coffer_renameat2(
                    AT_FDCWD, mount.path("dir/b.txt"), AT_FDCWD, mount.path("dir/c.txt"), coffer_rename_noreplace())
            } == EEXIST)
        try posix("renameat2 exchange") {
            coffer_renameat2(
                AT_FDCWD, mount.path("dir/b.txt"), AT_FDCWD, mount.path("dir/c.txt"), coffer_rename_exchange())
        }
        #expect(try readFile(mount.path("dir/b.txt")) == Array("ccc".utf8))
        #expect(try readFile(mount.path("dir/c.txt")) == Array("abcdef".utf8))
        try posix("renameat2 noreplace") {
            coffer_renameat2(
                AT_FDCWD, mount.path("dir/c.txt"), AT_FDCWD, mount.path("dir/d.txt"), coffer_rename_noreplace())
        }
        // The failed RENAME_NOREPLACE never reached us: the kernel knew the
        // target existed from its dentry cache.
        #expect(fs.state.withLock { $0.renameFlagsSeen } == [[], [.exchange], [.noReplace]])
        // Replacing rename over an existing file.
        try posix("rename over") { rename(mount.path("dir/d.txt"), mount.path("dir/b.txt")) }
        #expect(try readFile(mount.path("dir/b.txt")) == Array("abcdef".utf8))
        #expect(try listDirectory(mount.path("dir")).sorted() == [".", "..", "b.txt"])

        // Symlinks and hard links.
        try posix("symlink") { symlink("dir/b.txt", mount.path("link")) }
        #expect(try FileManager.default.destinationOfSymbolicLink(atPath: mount.path("link")) == "dir/b.txt")
        #expect(try readFile(mount.path("link")) == Array("abcdef".utf8))
        try posix("link") { link(mount.path("dir/b.txt"), mount.path("hard")) }
        #expect(try statPath(mount.path("hard")).st_nlink == 2)
        #expect(try statPath(mount.path("hard")).st_ino == statPath(mount.path("dir/b.txt")).st_ino)

        // Device nodes and FIFOs are refused by the implementation.
        #expect(posixErrno { mkfifo(mount.path("fifo"), 0o644) } == EPERM)

        // Extended attributes, including the size probe and ERANGE.
        let value = Array("some value".utf8)
        try posix("setxattr") { setxattr(mount.path("dir/b.txt"), "user.test", value, value.count, 0) }
        #expect(
            posixErrno { setxattr(mount.path("dir/b.txt"), "user.test", value, value.count, Int32(XATTR_CREATE)) }
                == EEXIST)
        #expect(
            posixErrno { setxattr(mount.path("dir/b.txt"), "user.none", value, value.count, Int32(XATTR_REPLACE)) }
                == ENODATA)
        #expect(try posix("getxattr probe") { getxattr(mount.path("dir/b.txt"), "user.test", nil, 0) } == value.count)
        var small = [UInt8](repeating: 0, count: 3)
        #expect(posixErrno { getxattr(mount.path("dir/b.txt"), "user.test", &small, small.count) } == ERANGE)
        var buffer = [UInt8](repeating: 0, count: 64)
        let got = try posix("getxattr") { getxattr(mount.path("dir/b.txt"), "user.test", &buffer, buffer.count) }
        #expect(Array(buffer[..<got]) == value)
        try posix("setxattr 2") { setxattr(mount.path("dir/b.txt"), "user.other", nil, 0, 0) }
        let listSize = try posix("listxattr probe") { listxattr(mount.path("dir/b.txt"), nil, 0) }
        #expect(listSize == "user.other\0user.test\0".utf8.count)
        #expect(posixErrno { listxattr(mount.path("dir/b.txt"), &small, small.count) } == ERANGE)
        let listed2 = try posix("listxattr") { listxattr(mount.path("dir/b.txt"), &buffer, buffer.count) }
        #expect(
            buffer[..<listed2].split(separator: 0).map { String(decoding: $0, as: UTF8.self) } == [
                "user.other", "user.test",
            ])
        try posix("removexattr") { removexattr(mount.path("dir/b.txt"), "user.test") }
        #expect(posixErrno { getxattr(mount.path("dir/b.txt"), "user.test", nil, 0) } == ENODATA)

        // statfs.
        var sv = statvfs()
        try posix("statvfs") { statvfs(mount.path(""), &sv) }
        #expect(sv.f_blocks == 1 << 20)
        #expect(sv.f_namemax == 255)

        // Invalidation from a non-handler thread succeeds (or finds nothing).
        let dirIno = InodeNumber(try statPath(mount.path("dir")).st_ino)
        try mount.session.invalidateEntry(parent: FuseRootInode, name: "dir")
        try mount.session.invalidateInode(dirIno)
        try mount.session.invalidateEntry(parent: FuseRootInode, name: "never-looked-up")
        #expect(try readFile(mount.path("dir/b.txt")) == Array("abcdef".utf8))

        // Removal, including the rules for directories.
        #expect(posixErrno { rmdir(mount.path("dir")) } == ENOTEMPTY)
        #expect(posixErrno { unlink(mount.path("dir")) } == EISDIR)
        for name in names { try posix("unlink") { unlink(mount.path("many/" + name)) } }
        for path in ["dir/b.txt", "hard", "link", "big.bin"] {
            try posix("unlink \(path)") { unlink(mount.path(path)) }
        }
        try posix("rmdir") { rmdir(mount.path("dir")) }
        try posix("rmdir many") { rmdir(mount.path("many")) }
        #expect(try listDirectory(mount.path("")).sorted() == [".", ".."])

        // Every reference the kernel took (lookups, creates, readdirplus
        // entries) comes back through forget once the names are gone.
        let drained = waitUntil(seconds: 10) { fs.liveInodes.isEmpty }
        #expect(drained, "still alive: \(fs.liveInodes)")
        #expect(fs.state.withLock { $0.violations } == [])

        mount.session.exit()
        let result = try mount.join()
        #expect(throws: Never.self) { try result.get() }
        #expect(!mount.isMounted)
        #expect(fs.state.withLock { $0.destroyCount } == 1)
    }

    /// Holds the request `start` sends (on a thread of its own) inside its handler through
    /// `hold`, and checks that the calls in `meanwhile` (each 0 or an errno) are all answered
    /// within `limit` seconds; then lets the held request finish and checks it succeeded. On
    /// threads, so a regression shows as a failure after a timeout, not a hang.
    func expectServedWhileHeld(
        _ hold: RequestHold, _ what: String, limit: Double,
        start: @escaping @Sendable () -> Int32,
        meanwhile: @escaping @Sendable () -> [Int32]
    ) {
        hold.hold()
        let heldResult = Mutex<Int32>(-1)
        let heldDone = DispatchSemaphore(value: 0)
        Thread {
            let rc = start()
            heldResult.withLock { $0 = rc }
            heldDone.signal()
        }.start()
        #expect(hold.awaitHandler(), "the \(what) reached its handler")

        let results = Mutex<[Int32]>([])
        let served = DispatchSemaphore(value: 0)
        Thread {
            let r = meanwhile()
            results.withLock { $0 = r }
            served.signal()
        }.start()
        let inTime = served.wait(timeout: .now() + limit) == .success
        #expect(inTime, "requests were not served while the \(what) was held")
        #expect(heldDone.wait(timeout: .now()) == .timedOut, "the \(what) is still held")
        hold.release()
        #expect(heldDone.wait(timeout: .now() + 10) == .success)
        if !inTime { _ = served.wait(timeout: .now() + 10) }
        #expect(heldResult.withLock { $0 } == 0, "the \(what) itself")
        #expect(results.withLock { $0 }.allSatisfy { $0 == 0 }, "\(results.withLock { $0 })")
    }

    /// A mount whose reader is never taken over within a test's time (so only handing on can
    /// serve other requests while one is held), with a file "held" open for writing.
    func mountWithOpenFile() throws -> (MountHarness, Int32) {
        let mount = try MountHarness(
            configuration: .init(
                mountOptions: Self.options, attributeTimeout: 0, handleSignals: false, stallMicroseconds: 60_000_000))
        do {
            try mount.start()
            try writeFile(mount.path("held"), [1, 2, 3])
            return (mount, try posix("open") { open(mount.path("held"), O_WRONLY | O_CLOEXEC) })
        } catch {
            mount.cleanUp()
            throw error
        }
    }

    /// One worker at a time reads requests (`CFuseReader`), keeping that right while it handles
    /// a short request. Before a long one it must hand it on, or every other request would
    /// wait: here an fsync stays in its handler while a mkdir, a create and a stat are served.
    @Test func shortRequestsAreServedWhileALongOneRuns() throws {
        let (mount, fd) = try mountWithOpenFile()
        defer { mount.cleanUp() }
        defer { close(fd) }
        expectServedWhileHeld(
            mount.filesystem.fsyncHold, "fsync", limit: 10, start: { Glibc.fsync(fd) == 0 ? 0 : errno }
        ) {
            [
                mkdir(mount.path("made-meanwhile"), 0o755) == 0 ? 0 : errno,
                (try? writeFile(mount.path("created-meanwhile"), [9])) != nil ? 0 : EIO,
                (try? statPath(mount.path("created-meanwhile"))) != nil ? 0 : ENOENT,
            ]
        }
    }

    /// A close is a short request to the reader; the filesystem says when its flush may take
    /// long (`closeMayTakeLong`) and the bridge then hands reading on itself. Here a flush stays
    /// in its handler while a mkdir, a stat and a readdir are served.
    @Test func aCloseThatMayTakeLongHandsOnReading() throws {
        let (mount, fd) = try mountWithOpenFile()
        defer { mount.cleanUp() }
        expectServedWhileHeld(
            mount.filesystem.flushHold, "close", limit: 10, start: { Glibc.close(fd) == 0 ? 0 : errno }
        ) {
            [
                mkdir(mount.path("made-meanwhile"), 0o755) == 0 ? 0 : errno,
                (try? statPath(mount.path("made-meanwhile"))) != nil ? 0 : ENOENT,
                (try? listDirectory(mount.path(""))) != nil ? 0 : EIO,
            ]
        }
        // With nothing held, closes are short again and the session keeps serving.
        for i in 0..<50 { try writeFile(mount.path("after-\(i)"), [UInt8(i)]) }
        #expect(try readFile(mount.path("after-49")) == [49])
    }

    /// A write of up to 128 KiB is a short request to the reader; the filesystem says when one
    /// may take long (`writeMayTakeLong`: a chunk to read back, a spill) and the bridge then
    /// hands reading on itself. Here a small write stays in its handler while a mkdir, a stat
    /// and a readdir are served.
    @Test func aSmallWriteThatMayTakeLongHandsOnReading() throws {
        let (mount, fd) = try mountWithOpenFile()
        defer { mount.cleanUp() }
        defer { close(fd) }
        expectServedWhileHeld(
            mount.filesystem.writeHold, "write", limit: 10,
            start: {
                [UInt8](repeating: 5, count: 4096).withUnsafeBytes { pwrite(fd, $0.baseAddress, $0.count, 0) } == 4096
                    ? 0 : errno
            }
        ) {
            [
                mkdir(mount.path("made-meanwhile"), 0o755) == 0 ? 0 : errno,
                (try? statPath(mount.path("made-meanwhile"))) != nil ? 0 : ENOENT,
                (try? listDirectory(mount.path(""))) != nil ? 0 : EIO,
            ]
        }
        // With nothing held, small writes are short again and the session keeps serving.
        for i in 0..<50 { try writeFile(mount.path("after-\(i)"), [UInt8](repeating: UInt8(i), count: 20_000)) }
        #expect(try readFile(mount.path("after-49")) == [UInt8](repeating: 49, count: 20_000))
    }

    /// A read of up to 128 KiB is a short request as well (`readMayTakeLong` decides when it
    /// hands on): here a small read stays in its handler while other requests are served.
    @Test func aSmallReadThatMayTakeLongHandsOnReading() throws {
        let mount = try MountHarness(
            configuration: .init(
                mountOptions: Self.options, attributeTimeout: 0, handleSignals: false, stallMicroseconds: 60_000_000))
        defer { mount.cleanUp() }
        try mount.start()
        try writeFile(mount.path("small"), [UInt8](repeating: 3, count: 5000))
        // Direct I/O (O_DIRECT, 0o40000 on Linux, which Glibc's module leaves out): the read
        // reaches the handler whatever the page cache holds.
        let fd = try posix("open") { open(mount.path("small"), O_RDONLY | 0o40000 | O_CLOEXEC) }
        defer { close(fd) }
        expectServedWhileHeld(
            mount.filesystem.readHold, "read", limit: 10,
            start: {
                let buffer = UnsafeMutableRawPointer.allocate(byteCount: 8192, alignment: 4096)
                defer { buffer.deallocate() }
                return pread(fd, buffer, 8192, 0) == 5000 ? 0 : errno
            }
        ) {
            [
                mkdir(mount.path("made-meanwhile"), 0o755) == 0 ? 0 : errno,
                (try? statPath(mount.path("made-meanwhile"))) != nil ? 0 : ENOENT,
                (try? listDirectory(mount.path(""))) != nil ? 0 : EIO,
            ]
        }
        for i in 0..<50 { try writeFile(mount.path("after-\(i)"), [UInt8](repeating: UInt8(i), count: 3000)) }
        for i in 0..<50 { #expect(try readFile(mount.path("after-\(i)")) == [UInt8](repeating: UInt8(i), count: 3000)) }
    }

    /// A short request whose handler blocks (here a mkdir, as if waiting for a lock a sync holds)
    /// keeps the reader token; a waiting worker must notice and read in its place, or every
    /// other request would wait behind it.
    @Test func aStuckShortRequestDoesNotHoldUpTheOthers() throws {
        let mount = try MountHarness(
            configuration: .init(
                mountOptions: Self.options, attributeTimeout: 0, handleSignals: false))
        defer { mount.cleanUp() }
        try mount.start()
        try writeFile(mount.path("before"), [1])
        // The stuck mkdir goes in its own folder: the kernel holds that folder's lock meanwhile.
        try posix("mkdir") { mkdir(mount.path("sub"), 0o755) }
        #expect(mount.session.readerTakeovers == 0)
        // An idle mount's waiters look once a second; the first look after the stall takes over.
        expectServedWhileHeld(
            mount.filesystem.mkdirHold, "mkdir", limit: 5,
            start: { mkdir(mount.path("sub/stuck"), 0o755) == 0 ? 0 : errno }
        ) {
            [
                (try? statPath(mount.path("before"))) != nil ? 0 : ENOENT,
                (try? writeFile(mount.path("created-meanwhile"), [9])) != nil ? 0 : EIO,
                (try? listDirectory(mount.path(""))) != nil ? 0 : EIO,
            ]
        }
        let takeovers = mount.session.readerTakeovers
        #expect(takeovers >= 1)
        // The worker that was stuck gives way to the one reading now; both keep serving.
        for i in 0..<50 { try writeFile(mount.path("after-\(i)"), [UInt8(i)]) }
        #expect(try readFile(mount.path("after-49")) == [49])
        // The count outlives the session, for the daemon's log.
        #expect(try runCommand("/usr/bin/fusermount3", ["-u", mount.mountPoint]) == 0)
        _ = try mount.join()
        #expect(mount.session.readerTakeovers >= takeovers)
    }

    /// `OpenReply.noFlush` reaches the kernel: closing a read-only descriptor sends no FLUSH,
    /// closing a writable one still does.
    @Test func noFlushOpensCloseWithoutAFlush() throws {
        let mount = try MountHarness(configuration: .init(mountOptions: Self.options, handleSignals: false))
        defer { mount.cleanUp() }
        try mount.start()
        try writeFile(mount.path("f"), [1, 2, 3])
        func flushes() -> Int { mount.filesystem.state.withLock { $0.flushCalls } }
        let afterCreate = flushes()
        #expect(afterCreate >= 1, "the created file's close")
        for _ in 0..<3 {
            let fd = open(mount.path("f"), O_RDONLY | O_CLOEXEC)
            #expect(fd >= 0)
            var buffer = [UInt8](repeating: 0, count: 8)
            #expect(read(fd, &buffer, 8) == 3)
            #expect(close(fd) == 0)
        }
        #expect(flushes() == afterCreate, "read-only closes")
        let fd = open(mount.path("f"), O_RDWR | O_CLOEXEC)
        #expect(fd >= 0)
        #expect(close(fd) == 0)
        #expect(flushes() == afterCreate + 1, "a writable close")
    }

    /// Which requests make the reader hand on its right to read (`CFuseReader/fuse_reader.c`).
    @Test func longRequestsAreRecognised() {
        func mayTakeLong(_ opcode: UInt32, setattrValid: UInt32? = nil) -> Bool {
            var bytes = [UInt8](repeating: 0, count: 40 + 8)
            withUnsafeBytes(of: UInt32(40).littleEndian) { bytes.replaceSubrange(0..<4, with: $0) }
            withUnsafeBytes(of: opcode.littleEndian) { bytes.replaceSubrange(4..<8, with: $0) }
            if let v = setattrValid { withUnsafeBytes(of: v.littleEndian) { bytes.replaceSubrange(40..<44, with: $0) } }
            return bytes.withUnsafeBytes { coffer_fuse_request_may_take_long($0.baseAddress, $0.count) } != 0
        }
        for long: UInt32 in [20, 30, 43, 47] { #expect(mayTakeLong(long), "opcode \(long)") }
        // WRITE (16) is short up to 128 KiB of data (after the header and fuse_write_in); the
        // handler hands on when one may block (`FileSystemOperations.mayTakeLong`).
        func writeMayTakeLong(payload: Int) -> Bool {
            var bytes = [UInt8](repeating: 0, count: 40 + 40 + payload)
            withUnsafeBytes(of: UInt32(bytes.count).littleEndian) { bytes.replaceSubrange(0..<4, with: $0) }
            withUnsafeBytes(of: UInt32(16).littleEndian) { bytes.replaceSubrange(4..<8, with: $0) }
            return bytes.withUnsafeBytes { coffer_fuse_request_may_take_long($0.baseAddress, $0.count) } != 0
        }
        #expect(!writeMayTakeLong(payload: 1), "a one-byte write")
        #expect(!writeMayTakeLong(payload: 128 * 1024), "a 128 KiB write")
        #expect(writeMayTakeLong(payload: 128 * 1024 + 1), "a write over 128 KiB")
        #expect(writeMayTakeLong(payload: 1 << 20), "a 1 MiB write")
        // READ (15) likewise, by the size it asks for (byte 16 of fuse_read_in).
        func readMayTakeLong(size: UInt32?) -> Bool {
            var bytes = [UInt8](repeating: 0, count: 40 + (size == nil ? 8 : 40))
            withUnsafeBytes(of: UInt32(bytes.count).littleEndian) { bytes.replaceSubrange(0..<4, with: $0) }
            withUnsafeBytes(of: UInt32(15).littleEndian) { bytes.replaceSubrange(4..<8, with: $0) }
            if let size { withUnsafeBytes(of: size.littleEndian) { bytes.replaceSubrange(56..<60, with: $0) } }
            return bytes.withUnsafeBytes { coffer_fuse_request_may_take_long($0.baseAddress, $0.count) } != 0
        }
        #expect(!readMayTakeLong(size: 4096), "a 4 KiB read")
        #expect(!readMayTakeLong(size: 128 * 1024), "a 128 KiB read")
        #expect(readMayTakeLong(size: 128 * 1024 + 1), "a read over 128 KiB")
        #expect(readMayTakeLong(size: 1 << 20), "a 1 MiB read-ahead")
        #expect(readMayTakeLong(size: nil), "a READ too short to hold its size")
        // RELEASE and FLUSH (18, 25) are short: the handler hands on when it must. So is
        // GETXATTR (22), which the kernel sends before writes (`security.capability`).
        for short: UInt32 in [1, 3, 9, 10, 11, 18, 22, 25, 27, 28, 35, 44, 45] {
            #expect(!mayTakeLong(short), "opcode \(short)")
        }
        #expect(mayTakeLong(4, setattrValid: 1 << 3), "a truncating setattr")
        #expect(!mayTakeLong(4, setattrValid: 1 << 0 | 1 << 4 | 1 << 5), "chmod and utimens")
        #expect(
            [UInt8](repeating: 0, count: 10).withUnsafeBytes {
                coffer_fuse_request_may_take_long($0.baseAddress, $0.count)
            } != 0,
            "a short read is treated as long")
    }

    @Test func plainReaddirAndTerminationSignal() throws {
        let mount = try MountHarness(
            configuration: .init(
                mountOptions: Self.options, readdirPlus: .never, handleSignals: true))
        defer { mount.cleanUp() }
        try mount.start()
        let fs = mount.filesystem
        #expect(mount.session.connection?.readdirPlus == false)

        try posix("mkdir") { mkdir(mount.path("d"), 0o700) }
        let names = (0..<1000).map { "file-\($0)-" + String(repeating: "y", count: $0 % 200) }
        for name in names { try writeFile(mount.path("d/" + name), Array(name.utf8)) }
        let listed = try listDirectory(mount.path("d"))
        #expect(listed.count == names.count + 2)
        #expect(Set(listed) == Set(names + [".", ".."]))
        #expect(fs.state.withLock { ($0.readdirCalls, $0.readdirPlusCalls) }.1 == 0)
        #expect(fs.state.withLock { $0.readdirCalls } > 3)
        #expect(try readFile(mount.path("d/" + names[123])) == Array(names[123].utf8))

        // A process-directed SIGHUP may land on any thread; the session must
        // still wind down, unmount and run destroy.
        kill(getpid(), SIGHUP)
        let result = try mount.join()
        #expect(throws: Never.self) { try result.get() }
        #expect(!mount.isMounted)
        #expect(fs.state.withLock { $0.destroyCount } == 1)
        #expect(fs.state.withLock { $0.violations } == [])
    }

    @Test func externalUnmountEndsRun() throws {
        let mount = try MountHarness(configuration: .init(mountOptions: Self.options, handleSignals: false))
        defer { mount.cleanUp() }
        try mount.start()
        try writeFile(mount.path("f"), [1, 2, 3])
        #expect(try runCommand("/usr/bin/fusermount3", ["-u", mount.mountPoint]) == 0)
        let result = try mount.join()
        #expect(throws: Never.self) { try result.get() }
        #expect(!mount.isMounted)
        #expect(mount.filesystem.state.withLock { $0.destroyCount } == 1)
        #expect(throws: FSError(ENOTCONN)) { try mount.session.invalidateInode(FuseRootInode) }
        #expect(throws: FuseSessionError.alreadyStarted) { try mount.session.run() }
    }
}
