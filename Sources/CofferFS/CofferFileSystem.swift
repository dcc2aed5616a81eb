import CofferFuse
import CofferModel
import CofferVault
import Foundation
import Synchronization

/// The Coffer filesystem: FUSE low-level operations over a `Vault`.
///
/// Like libfuse's passthrough_ll, there is one table of operations (`FileSystemOperations`,
/// split by family into the `CofferFileSystem+*.swift` files) and one place for inode reference
/// counting (`InodeTable`). Inode numbers are a keyed hash of file ids, the key the store's,
/// so they are stable per device across remounts; the kernel's lookup counts live only in
/// memory.
public final class CofferFileSystem: FileSystemOperations {
    public let vault: Vault
    let inodes: InodeTable
    let handles = Mutex<HandleTable>(HandleTable())
    let log: @Sendable (String) -> Void
    let hooks = Mutex<Hooks>(Hooks())

    struct Hooks {
        var ready: (@Sendable () -> Void)?
        var beforeDestroy: (@Sendable () -> Void)?
    }

    /// Called once the kernel has completed the mount handshake.
    public var onReady: (@Sendable () -> Void)? {
        get { hooks.withLock { $0.ready } }
        set { hooks.withLock { $0.ready = newValue } }
    }

    /// Called first thing in `destroy` (the change watcher stops there).
    public var beforeDestroy: (@Sendable () -> Void)? {
        get { hooks.withLock { $0.beforeDestroy } }
        set { hooks.withLock { $0.beforeDestroy = newValue } }
    }

    /// `measuringOperations`: account the CPU time of each operation and log it at unmount.
    public convenience init(
        vault: Vault, measuringOperations: Bool = false, log: @escaping @Sendable (String) -> Void = { _ in }
    )
        throws
    {
        try self.init(
            vault: vault, measuringOperations: measuringOperations, inodeCacheCapacity: InodeTable.cacheCapacity,
            log: log)
    }

    /// `inodeCacheCapacity`: entries the inode table's names cache keeps (tests make it small);
    /// `inodeHash` stands in for the keyed hash of inode numbers (tests make files collide).
    init(
        vault: Vault, measuringOperations: Bool, inodeCacheCapacity: Int,
        inodeHash: (@Sendable (FileID) -> UInt64)? = nil, log: @escaping @Sendable (String) -> Void
    ) throws {
        self.vault = vault
        self.log = log
        self.stats = measuringOperations ? OperationStats() : nil
        self.inodes = try InodeTable(vault: vault, cacheCapacity: inodeCacheCapacity, hash: inodeHash)
    }

    // MARK: Errors

    /// Maps any error to the errno a Linux filesystem would return.
    static func fsError(_ error: any Error) -> FSError {
        switch error {
        case let e as FSError: return e
        case let e as VaultError: return FSError(e.errno)
        case let e as TreeError: return FSError(VaultError.tree(e).errno)
        case let e as XattrError: return e == .exists ? .exists : .noAttribute
        default: return .io
        }
    }

    /// Per-operation CPU accounting (`coffer mount -o stats`, written to the log at unmount):
    /// where the daemon's time goes, without a profiler.
    let stats: OperationStats?

    /// Runs an operation body, translating errors.
    func op<T>(_ name: StaticString = #function, _ body: () throws -> T) throws -> T {
        if let stats {
            let start = OperationStats.threadCPU()
            defer { stats.add(name, OperationStats.threadCPU() - start) }
            return try translatingErrors(body)
        }
        return try translatingErrors(body)
    }

    private func translatingErrors<T>(_ body: () throws -> T) throws -> T {
        do { return try body() } catch {
            let e = Self.fsError(error)
            if e.errno == EIO { log("EIO: \(error)") }
            throw e
        }
    }

    // MARK: Attributes

    /// Every reply that carries attributes (getattr, setattr, lookup, create, readdirplus) is
    /// built here, so the link count and times agree whichever way the kernel asked.
    func attributes(_ node: Node, unlinked: Bool = false) -> Attributes {
        let a = node.attributes
        // An unlinked open document keeps changing through its handles; its snapshot does not.
        let open = unlinked && node.type == .document ? openDocumentHandle(for: node.id) : nil
        let size = open?.currentSize ?? node.size
        var mtimeValue = a.mtime.value
        var ctimeValue = a.ctime
        // Written since its snapshot last changed: the write's time is its mtime and ctime.
        if let written = open?.lastContentChange, written > ctimeValue {
            mtimeValue = written
            ctimeValue = written
        }
        return Attributes(
            mode: node.mode, linkCount: unlinked ? 0 : node.linkCount, uid: a.uid.value, gid: a.gid.value, size: size,
            blocks: (size + 511) / 512, blockSize: 128 * 1024,
            accessTime: FileTime(a.atime.value), modificationTime: FileTime(mtimeValue),
            changeTime: FileTime(ctimeValue))
    }

    /// Changes the snapshot of a file that lost its name while held (`unlinkedNodes`): it has
    /// no record any more, but its descriptors still see changes. Nil if there is none.
    func changeUnlinked(_ id: FileID, _ body: (inout PosixAttributes) throws -> Void) throws -> Node? {
        try handles.withLock { t in
            guard let last = t.unlinkedNodes[id] else { return nil }
            let node = try Self.changed(last, body)
            t.unlinkedNodes[id] = node
            return node
        }
    }

    /// `node` with `body` applied to its attributes (or none); any change moves ctime to now.
    static func changed(_ node: Node) -> Node { changed(node) { _ in } }

    static func changed(_ node: Node, _ body: (inout PosixAttributes) throws -> Void) rethrows -> Node {
        var a = node.attributes
        try body(&a)
        a.ctime = max(a.ctime, Timespec(FileTime.now()))
        return Node(id: node.id, type: node.type, parent: node.parent, name: node.name, attributes: a)
    }

    /// The reply for a name the kernel will know in the folder it calls `parent`: one more
    /// reference to its inode.
    func entry(_ node: Node, parent: InodeNumber) throws -> Entry {
        let ino = inodes.reference(node.id, parent: parent, name: node.name)
        return Entry(inode: ino, attributes: attributes(node))
    }

    /// The node behind an inode, including a file that was unlinked while open (nlink 0).
    func node(_ ino: InodeNumber) throws -> (Node, unlinked: Bool) {
        guard let id = inodes.fileID(ino) else { throw FSError.notFound }
        if let live = try vault.liveNode(id) { return (live, false) }
        if let last = handles.withLock({ $0.unlinkedNodes[id] }) { return (last, true) }
        throw FSError.notFound
    }

    /// The folder an inode names; ENOENT if it is gone (unlinked), ENOTDIR if it is no folder.
    func folderID(_ ino: InodeNumber) throws -> FileID {
        guard let id = inodes.fileID(ino) else { throw FSError.notFound }
        switch vault.liveType(id) {
        case .folder: return id
        case nil: throw FSError.notFound
        default: throw FSError.notDirectory
        }
    }

    /// `folderID` for an operation that changes what is in the folder: EACCES in a share (a
    /// link, or a shared folder) this account may only read (docs/SHARING.md).
    func writableFolderID(_ ino: InodeNumber) throws -> FileID {
        let id = try folderID(ino)
        if vault.isReadOnlyShare(id) { throw FSError.permissionDenied }
        return id
    }

    // MARK: Lifecycle

    public func initialize(connection: ConnectionInfo) {
        let version = "\(connection.protocolMajor).\(connection.protocolMinor)"
        log("mounted: protocol \(version), max write \(connection.maxWrite)")
        onReady?()
    }

    /// Runs after the kernel is done with the mount: every open document is flushed and the
    /// store made durable, so an unmount (or SIGTERM) never loses a buffered write.
    public func destroy() {
        beforeDestroy?()
        flushEverything()
        if let stats { log(stats.report()) }
        log("unmounted")
    }

    public func flushEverything() {
        let docs = handles.withLock { t in t.files.values.map(\.document) }
        for d in docs { do { try d.flush() } catch { log("flush failed at unmount: \(error)") } }
        do { try vault.flushFolderTimes() } catch { log("writing folder times failed at unmount: \(error)") }
        do { try vault.makeDurable() } catch { log("sync failed at unmount: \(error)") }
    }
}

/// Open files and directories by handle number. Everything here lives while a file is open or
/// held by the kernel, and goes at its release or forget.
struct HandleTable {
    var next: UInt64 = 1
    var files: [UInt64: OpenFileHandle] = [:]
    /// One listing per open directory handle, dropped at releasedir.
    var directories: [UInt64: DirectorySnapshot] = [:]
    /// Nodes of documents unlinked (or replaced by a rename) while open or still known to the
    /// kernel, so fstat keeps working until the last close.
    var unlinkedNodes: [FileID: Node] = [:]
    /// Replaced or unlinked documents the kernel still holds an inode for: kept open (as
    /// passthrough_ll keeps its fds) so an open that raced the rename still gets the old content.
    /// Released when the kernel forgets the inode.
    var zombies: [InodeNumber: OpenDocument] = [:]

    mutating func allocate() -> UInt64 {
        defer { next += 1 }
        return next
    }
}

struct OpenFileHandle {
    let inode: InodeNumber
    let document: OpenDocument
    let append: Bool
    let writable: Bool
}

/// A folder's listing as opendir saw it: "." and ".." first, then its children, so readdir's
/// offsets stay stable however the folder changes meanwhile.
struct DirectorySnapshot {
    let folder: Node
    let parent: Node
    let children: [Node]

    var count: Int { children.count + 2 }

    func name(at index: Int) -> String {
        switch index {
        case 0: "."
        case 1: ".."
        default: children[index - 2].name
        }
    }

    func node(at index: Int) -> Node {
        switch index {
        case 0: folder
        case 1: parent
        default: children[index - 2]
        }
    }
}

/// CPU time spent per filesystem operation (thread CPU time, so waiting is not counted).
final class OperationStats: Sendable {
    private let table = Mutex<[String: (count: Int, nanoseconds: Int64)]>([:])

    func add(_ name: StaticString, _ nanoseconds: Int64) {
        let key = name.description
        table.withLock { t in
            let old = t[key] ?? (0, 0)
            t[key] = (old.count + 1, old.nanoseconds + nanoseconds)
        }
    }

    func report() -> String {
        let rows = table.withLock { $0 }.sorted { $0.value.nanoseconds > $1.value.nanoseconds }
        let total = rows.reduce(Int64(0)) { $0 + $1.value.nanoseconds }
        var out = "operation CPU (total \(total / 1_000_000) ms):"
        for (name, v) in rows {
            let op = name.split(separator: "(").first.map(String.init) ?? name
            let each = v.nanoseconds / Int64(max(1, v.count)) / 1000
            out += "\n  \(op): \(v.count) calls, \(v.nanoseconds / 1_000_000) ms, \(each) µs each"
        }
        return out
    }

    static func threadCPU() -> Int64 {
        var ts = timespec()
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts)
        return Int64(ts.tv_sec) * 1_000_000_000 + Int64(ts.tv_nsec)
    }
}

extension Timespec {
    init(_ t: FileTime) { self.init(seconds: t.seconds, nanoseconds: t.nanoseconds) }
}

extension FileTime {
    init(_ t: Timespec) { self.init(seconds: t.seconds, nanoseconds: t.nanoseconds) }
}
