import CofferFuse
import CofferModel
import CofferVault
import Foundation
import Synchronization

/// Keeps the kernel's caches true when the store changes behind its back (a `coffer` command,
/// later the sync routine): polls the store's change log and invalidates the affected dentries,
/// attributes and cached pages. Runs on its own thread, never inside a request handler, because
/// a notification sent from a handler can deadlock the kernel. Being the daemon's one periodic
/// thread, it also hands freed memory back to the system (`MountService.returnFreedMemory`).
public final class ChangeWatcher: Sendable {
    let fs: CofferFileSystem
    let session: FuseSession
    let interval: Double
    let stopped = Atomic<Bool>(false)
    let finished = Mutex<Bool>(false)

    public init(fs: CofferFileSystem, session: FuseSession, interval: Double = 0.2) {
        self.fs = fs
        self.session = session
        self.interval = interval
    }

    /// How often freed memory goes back to the system (`MountService.returnFreedMemory`):
    /// every 5 ticks, once a second at the default interval.
    static let ticksPerTrim = 5

    public func start() {
        let t = Thread { [self] in self.loop() }
        t.name = "coffer-watcher"
        t.start()
    }

    public func stop() {
        stopped.store(true, ordering: .relaxed)
        let deadline = Date().addingTimeInterval(5)
        while !finished.withLock({ $0 }) && Date() < deadline { usleep(10_000) }
    }

    private func loop() {
        defer { finished.withLock { $0 = true } }
        var ticks = 0
        while !stopped.load(ordering: .relaxed) {
            usleep(UInt32(interval * 1_000_000))
            if stopped.load(ordering: .relaxed) { break }
            ticks &+= 1
            if ticks % Self.ticksPerTrim == 0 { MountService.returnFreedMemory() }
            do {
                try fs.vault.flushFolderTimes()
                let changed = try fs.vault.refreshAll()
                if !changed.isEmpty { invalidate(changed) }
            } catch {
                fs.log("refresh failed: \(error)")
            }
        }
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
            if let known = fs.inodes.takeKnownName(ino) {
                try? session.invalidateEntry(parent: known.parent, name: known.name)
                parents.insert(known.parent)
            }
            try? session.invalidateInode(ino)
        }
        for p in parents { try? session.invalidateInode(p) }
    }
}
