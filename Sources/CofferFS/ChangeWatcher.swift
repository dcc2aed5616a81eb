import CofferFuse
import CofferModel
import CofferVault
import Foundation
import Synchronization

/// Keeps the kernel's caches true when the store changes behind its back (a `coffer` command,
/// the sync routine): reads the store's change log whenever the store's log file changes
/// (inotify on the data directory, so an idle mount does no work at all) and invalidates the
/// affected dentries, attributes and cached pages. Runs on its own thread, never inside a
/// request handler, because a notification sent from a handler can deadlock the kernel. It also
/// writes the folder times the mount coalesces, tells `onStoreChange` (the sync scheduler) that
/// the store changed, and hands freed memory back to the system after activity
/// (`MountService.returnFreedMemory`).
public final class ChangeWatcher: Sendable {
    let fs: CofferFileSystem
    let session: FuseSession
    /// Shortest time between two reads of the change log: a burst of commits is read in steps
    /// of this, not once per commit.
    let interval: Double
    let onStoreChange: @Sendable () -> Void
    let stopped = Atomic<Bool>(false)
    let finished = Mutex<Bool>(false)
    /// Written to wake the thread for `stop`.
    let stopPipe: (read: Int32, write: Int32)

    public init(
        fs: CofferFileSystem, session: FuseSession, interval: Double = 0.2,
        onStoreChange: @escaping @Sendable () -> Void = {}
    ) {
        self.fs = fs
        self.session = session
        self.interval = interval
        self.onStoreChange = onStoreChange
        var fds: [Int32] = [-1, -1]
        if pipe(&fds) == 0 {
            for fd in fds {
                _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
                _ = fcntl(fd, F_SETFL, O_NONBLOCK)
            }
        } else {
            fds = [-1, -1]
        }
        stopPipe = (fds[0], fds[1])
    }

    deinit {
        if stopPipe.read >= 0 { close(stopPipe.read) }
        if stopPipe.write >= 0 { close(stopPipe.write) }
    }

    /// How long after activity freed memory goes back to the system.
    static let trimDelay = 1.0

    public func start() {
        let t = Thread { [self] in self.loop() }
        t.name = "coffer-watcher"
        t.start()
    }

    public func stop() {
        stopped.store(true, ordering: .relaxed)
        var one: UInt8 = 1
        if stopPipe.write >= 0 { _ = write(stopPipe.write, &one, 1) }
        let deadline = Date().addingTimeInterval(5)
        while !finished.withLock({ $0 }) && Date() < deadline { usleep(10_000) }
    }

    private func loop() {
        defer { finished.withLock { $0 = true } }
        let storeFile = (fs.vault.storeDatabasePath as NSString).lastPathComponent
        let directory = (fs.vault.storeDatabasePath as NSString).deletingLastPathComponent
        let events = StoreEvents(directory: directory, file: storeFile)
        if events == nil {
            fs.log("cannot watch \(directory) for changes (inotify); reading the change log every \(interval) s")
        }
        var lastRefresh = -Double.infinity
        var lastActivity: Double?
        // A look again after a refresh an event started: the log file is written before the
        // commit shows (SQLite marks it in the shared-memory index, which raises no event), so
        // a refresh right after the write may not see it yet.
        var followUp: Double?
        while !stopped.load(ordering: .relaxed) {
            // Without an event, only pending folder times, a follow-up or memory to give back
            // wake the thread.
            let t = Self.now()
            var timeout: Int32 = -1
            if events == nil || fs.vault.hasPendingFolderTimes {
                timeout = Int32(interval * 1000)
            } else if let f = followUp {
                timeout = Int32(max(0, (f - t) * 1000))
            } else if let a = lastActivity {
                timeout = Int32(max(0, (a + Self.trimDelay - t) * 1000))
            }
            var fds = [
                pollfd(fd: events?.fd ?? -1, events: Int16(POLLIN), revents: 0),
                pollfd(fd: stopPipe.read, events: Int16(POLLIN), revents: 0),
            ]
            let ready = poll(&fds, 2, timeout)
            if stopped.load(ordering: .relaxed) { break }
            let evented = ready > 0 && events?.drain() == true
            var changed = events == nil || evented
            if let f = followUp, Self.now() >= f {
                followUp = nil
                changed = true
            }
            if let a = lastActivity, Self.now() - a >= Self.trimDelay {
                MountService.returnFreedMemory()
                lastActivity = nil
            }
            if fs.vault.hasPendingFolderTimes {
                do { try fs.vault.flushFolderTimes() } catch { fs.log("writing folder times failed: \(error)") }
                changed = true
            }
            guard changed else { continue }
            // A burst of commits is read in steps of `interval`: what arrives meanwhile is read
            // with it.
            let wait = lastRefresh + interval - Self.now()
            if wait > 0 {
                usleep(UInt32(wait * 1_000_000))
                _ = events?.drain()
            }
            lastRefresh = Self.now()
            lastActivity = lastRefresh
            if evented { followUp = lastRefresh + interval }
            do {
                let changed = try fs.vault.refreshAll()
                if !changed.isEmpty { invalidate(changed) }
            } catch {
                fs.log("refresh failed: \(error)")
            }
            onStoreChange()
        }
    }

    /// Monotonic seconds.
    static func now() -> Double { ProcessInfo.processInfo.systemUptime }

    /// Whether `id` is still where the kernel learned it: the same name in the same folder.
    func stillNamed(_ id: FileID, _ known: InodeTable.KnownName) -> Bool {
        guard let n = try? fs.vault.node(id), !n.isRoot, n.name == known.name else { return false }
        let parent =
            fs.inodes.referencedInode(for: n.parent)
            ?? fs.vault.shownLink(placing: n.parent).flatMap(fs.inodes.referencedInode(for:))
        return parent == known.parent
    }

    /// Tells the kernel what changed, for the inodes it holds: each changed file's attributes and
    /// pages, the dentry it knew it by (if that name is still cached, `InodeTable`: one evicted
    /// stays until its entry timeout, 1 s), and the attributes of the folders it left or joined.
    public func invalidate(_ ids: Set<FileID>) {
        var parents: Set<InodeNumber> = []
        for id in ids {
            // The folder it is in now: its listing, link count or times changed. A shared folder
            // the mount shows at a link's place is known to the kernel by the link's inode.
            if let n = try? fs.vault.node(id), !n.isRoot,
                let p = fs.inodes.referencedInode(for: n.parent)
                    ?? fs.vault.shownLink(placing: n.parent).flatMap(fs.inodes.referencedInode(for:))
            {
                parents.insert(p)
            }
            if let link = fs.vault.shownLink(placing: id), let ino = fs.inodes.referencedInode(for: link) {
                try? session.invalidateInode(ino)
            }
            guard let ino = fs.inodes.referencedInode(for: id) else { continue }
            // The dentry only when the file left that name (moved, renamed, deleted): dropping
            // a folder's dentry unhashes it for any process inside it, whose getcwd then fails
            // (git in a shared folder while the sync brought the folder's record back).
            if let known = fs.inodes.knownName(ino), !stillNamed(id, known),
                fs.inodes.takeKnownName(ino) != nil
            {
                try? session.invalidateEntry(parent: known.parent, name: known.name)
                parents.insert(known.parent)
            }
            try? session.invalidateInode(ino)
        }
        for p in parents { try? session.invalidateInode(p) }
    }
}

/// inotify on the store's folder, for events on the store's files (the database, its log and
/// its shared memory index): every commit of any process writes the log.
final class StoreEvents {
    let fd: Int32
    let file: String

    init?(directory: String, file: String) {
        let fd = inotify_init1(Int32(O_NONBLOCK | O_CLOEXEC))
        guard fd >= 0 else { return nil }
        let mask = UInt32(IN_MODIFY) | UInt32(IN_CREATE) | UInt32(IN_MOVED_TO)
        guard inotify_add_watch(fd, directory, mask) >= 0 else {
            close(fd)
            return nil
        }
        self.fd = fd
        self.file = file
    }

    deinit { close(fd) }

    /// Reads every queued event; whether one was about the store's files (the database, its
    /// log, its index), not the daemon's log or anything else in the folder.
    func drain() -> Bool {
        var about = false
        let size = 16 * 1024
        let buffer = UnsafeMutableRawPointer.allocate(byteCount: size, alignment: 8)
        defer { buffer.deallocate() }
        let header = MemoryLayout<inotify_event>.size
        while true {
            let n = read(fd, buffer, size)
            guard n > 0 else { break }
            var offset = 0
            while offset + header <= n {
                let length = Int(buffer.load(fromByteOffset: offset + 12, as: UInt32.self))
                let nameStart = offset + header
                guard nameStart + length <= n else { break }
                // The name, NUL-padded, read within its length only.
                let name = UnsafeRawBufferPointer(start: buffer + nameStart, count: length).prefix { $0 != 0 }
                if name.starts(with: file.utf8) { about = true }
                offset = nameStart + length
            }
        }
        return about
    }
}
