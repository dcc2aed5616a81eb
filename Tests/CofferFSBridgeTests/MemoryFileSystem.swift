import CofferFS
import CofferFuse
import Dispatch
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// A deliberately small in-memory filesystem over the bridge. Besides serving
/// the tests it audits the kernel's reference counting: every `forget` must
/// match lookups this filesystem counted, otherwise a violation is recorded.
final class MemoryFileSystem: FileSystemOperations {
    struct Node {
        var attributes: Attributes
        var data: [UInt8] = []
        var children: [String: InodeNumber] = [:]
        var parent: InodeNumber = FuseRootInode
        var target = ""
        var xattrs: [String: [UInt8]] = [:]
        var lookups: UInt64 = 0
        var openCount = 0
    }

    struct State {
        var nodes: [InodeNumber: Node] = [:]
        var nextInode: InodeNumber = 2
        var nextHandle: UInt64 = 1
        var directorySnapshots: [UInt64: [(name: String, inode: InodeNumber)]] = [:]
        var violations: [String] = []
        var initialized: ConnectionInfo?
        var destroyCount = 0
        var readdirCalls = 0
        var readdirPlusCalls = 0
        var renameFlagsSeen: [RenameFlags] = []
        var flushCalls = 0
        var getxattrNames: [String] = []
    }

    let state = Mutex(State())
    /// Requests that stay in their handlers as long as a test wants (see `RequestHold`).
    let fsyncHold = RequestHold()
    /// Flush (close(2)) is a short request to the reader; `mayTakeLong` tells the bridge that
    /// a held one takes long.
    let flushHold = RequestHold()
    /// A small write is a short request too, and `mayTakeLong` says the same of a held one.
    let writeHold = RequestHold()
    /// A small read too.
    let readHold = RequestHold()
    /// Mkdir is short too, and nothing tells the bridge: a handler stuck on a lock.
    let mkdirHold = RequestHold()

    func fsync(inode: InodeNumber, handle: UInt64, dataOnly: Bool) throws {
        fsyncHold.pass()
    }

    func flush(inode: InodeNumber, handle: UInt64, lockOwner: UInt64) throws {
        state.withLock { $0.flushCalls += 1 }
        flushHold.pass()
    }

    func mayTakeLong(_ request: ShortRequest, inode: InodeNumber, handle: UInt64) -> Bool {
        switch request {
        case .flush, .release: flushHold.isHeld
        case .write: writeHold.isHeld
        case .read: readHold.isHeld
        }
    }

    init() {
        let now = FileTime.now()
        state.withLock {
            $0.nodes[FuseRootInode] = Node(
                attributes: Attributes(
                    mode: UInt32(S_IFDIR) | 0o755, linkCount: 2,
                    accessTime: now, modificationTime: now, changeTime: now))
        }
    }

    // MARK: Audit helpers for the tests

    /// Inodes other than the root still alive, with their lookup counts.
    var liveInodes: [InodeNumber: UInt64] {
        state.withLock { state in
            var result: [InodeNumber: UInt64] = [:]
            for (ino, node) in state.nodes where ino != FuseRootInode { result[ino] = node.lookups }
            return result
        }
    }

    // MARK: Helpers (call with the lock held)

    private static func newNode(_ state: inout State, mode: UInt32, context: RequestContext) -> InodeNumber {
        let now = FileTime.now()
        let ino = state.nextInode
        state.nextInode += 1
        state.nodes[ino] = Node(
            attributes: Attributes(
                mode: mode, linkCount: mode & UInt32(S_IFMT) == UInt32(S_IFDIR) ? 2 : 1,
                uid: context.uid, gid: context.gid,
                accessTime: now, modificationTime: now, changeTime: now))
        return ino
    }

    private static func directory(_ state: State, _ ino: InodeNumber) throws -> Node {
        guard let node = state.nodes[ino] else { throw FSError.notFound }
        guard node.attributes.isDirectory else { throw FSError.notDirectory }
        return node
    }

    private static func entry(_ state: inout State, _ ino: InodeNumber) -> Entry {
        state.nodes[ino]!.lookups += 1
        return Entry(inode: ino, attributes: state.nodes[ino]!.attributes)
    }

    private static func link(_ state: inout State, parent: InodeNumber, name: String, to ino: InodeNumber) {
        state.nodes[parent]!.children[name] = ino
        if state.nodes[ino]!.attributes.isDirectory { state.nodes[ino]!.parent = parent }
        touch(&state, parent)
    }

    private static func touch(_ state: inout State, _ ino: InodeNumber) {
        let now = FileTime.now()
        state.nodes[ino]?.attributes.modificationTime = now
        state.nodes[ino]?.attributes.changeTime = now
    }

    /// Drops a node once no name, kernel reference or open file keeps it.
    private static func collect(_ state: inout State, _ ino: InodeNumber) {
        guard ino != FuseRootInode, let node = state.nodes[ino] else { return }
        if node.attributes.linkCount == 0 && node.lookups == 0 && node.openCount == 0 {
            state.nodes[ino] = nil
        }
    }

    private static func unlinkName(_ state: inout State, parent: InodeNumber, name: String) {
        guard let ino = state.nodes[parent]?.children.removeValue(forKey: name) else { return }
        if state.nodes[ino]!.attributes.isDirectory {
            state.nodes[ino]!.attributes.linkCount = 0
        } else {
            state.nodes[ino]!.attributes.linkCount -= 1
        }
        state.nodes[ino]!.attributes.changeTime = FileTime.now()
        touch(&state, parent)
        collect(&state, ino)
    }

    private static func create(
        _ state: inout State, parent: InodeNumber, name: String, mode: UInt32, context: RequestContext
    ) throws -> InodeNumber {
        let dir = try directory(state, parent)
        guard dir.children[name] == nil else { throw FSError.exists }
        let ino = newNode(&state, mode: mode, context: context)
        link(&state, parent: parent, name: name, to: ino)
        return ino
    }

    // MARK: FileSystemOperations

    func initialize(connection: ConnectionInfo) {
        state.withLock { $0.initialized = connection }
    }

    func destroy() {
        state.withLock { $0.destroyCount += 1 }
    }

    func lookup(parent: InodeNumber, name: String) throws -> Entry {
        try state.withLock { state in
            let dir = try Self.directory(state, parent)
            guard let ino = dir.children[name] else { throw FSError.notFound }
            return Self.entry(&state, ino)
        }
    }

    func forget(inode: InodeNumber, lookups: UInt64) {
        state.withLock { state in
            guard let node = state.nodes[inode] else {
                state.violations.append("forget(\(inode), \(lookups)) of an unknown inode")
                return
            }
            guard node.lookups >= lookups else {
                state.violations.append("forget(\(inode), \(lookups)) exceeds \(node.lookups) lookups")
                state.nodes[inode]!.lookups = 0
                return
            }
            state.nodes[inode]!.lookups -= lookups
            Self.collect(&state, inode)
        }
    }

    func getattr(inode: InodeNumber, handle: UInt64?) throws -> Attributes {
        try state.withLock { state in
            guard let node = state.nodes[inode] else { throw FSError.notFound }
            return node.attributes
        }
    }

    func setattr(
        inode: InodeNumber, changes: AttributeChanges, handle: UInt64?, context: RequestContext
    ) throws -> Attributes {
        try state.withLock { state in
            guard var node = state.nodes[inode] else { throw FSError.notFound }
            let now = FileTime.now()
            if let mode = changes.mode { node.attributes.mode = node.attributes.fileType | (mode & 0o7777) }
            if let uid = changes.uid { node.attributes.uid = uid }
            if let gid = changes.gid { node.attributes.gid = gid }
            if let size = changes.size {
                guard !node.attributes.isDirectory else { throw FSError.isDirectory }
                node.data = Array(node.data.prefix(Int(size)))
                node.data += [UInt8](repeating: 0, count: Int(size) - node.data.count)
                node.attributes.size = size
                node.attributes.modificationTime = now
            }
            if let atime = changes.accessTime { node.attributes.accessTime = atime.resolved(now: now) }
            if let mtime = changes.modificationTime { node.attributes.modificationTime = mtime.resolved(now: now) }
            node.attributes.changeTime = changes.changeTime ?? now
            state.nodes[inode] = node
            return node.attributes
        }
    }

    func readlink(inode: InodeNumber) throws -> String {
        try state.withLock { state in
            guard let node = state.nodes[inode] else { throw FSError.notFound }
            guard node.attributes.isSymbolicLink else { throw FSError.invalid }
            return node.target
        }
    }

    func mknod(
        parent: InodeNumber, name: String, mode: UInt32, device: UInt64, context: RequestContext
    ) throws -> Entry {
        // Like the vault: regular files only, no devices, FIFOs or sockets.
        guard mode & UInt32(S_IFMT) == UInt32(S_IFREG) else { throw FSError.notPermitted }
        return try state.withLock { state in
            let ino = try Self.create(&state, parent: parent, name: name, mode: mode, context: context)
            return Self.entry(&state, ino)
        }
    }

    func mkdir(parent: InodeNumber, name: String, mode: UInt32, context: RequestContext) throws -> Entry {
        mkdirHold.pass()
        return try state.withLock { state in
            let ino = try Self.create(
                &state, parent: parent, name: name, mode: UInt32(S_IFDIR) | (mode & 0o7777), context: context)
            return Self.entry(&state, ino)
        }
    }

    func unlink(parent: InodeNumber, name: String) throws {
        try state.withLock { state in
            let dir = try Self.directory(state, parent)
            guard let ino = dir.children[name] else { throw FSError.notFound }
            guard !state.nodes[ino]!.attributes.isDirectory else { throw FSError.isDirectory }
            Self.unlinkName(&state, parent: parent, name: name)
        }
    }

    func rmdir(parent: InodeNumber, name: String) throws {
        try state.withLock { state in
            let dir = try Self.directory(state, parent)
            guard let ino = dir.children[name] else { throw FSError.notFound }
            guard state.nodes[ino]!.attributes.isDirectory else { throw FSError.notDirectory }
            guard state.nodes[ino]!.children.isEmpty else { throw FSError.notEmpty }
            Self.unlinkName(&state, parent: parent, name: name)
        }
    }

    func symlink(target: String, parent: InodeNumber, name: String, context: RequestContext) throws -> Entry {
        try state.withLock { state in
            let ino = try Self.create(
                &state, parent: parent, name: name, mode: UInt32(S_IFLNK) | 0o777, context: context)
            state.nodes[ino]!.target = target
            state.nodes[ino]!.attributes.size = UInt64(target.utf8.count)
            return Self.entry(&state, ino)
        }
    }

    func rename(
        parent: InodeNumber, name: String, newParent: InodeNumber, newName: String, flags: RenameFlags
    ) throws {
        try state.withLock { state in
            state.renameFlagsSeen.append(flags)
            let from = try Self.directory(state, parent)
            let to = try Self.directory(state, newParent)
            guard let source = from.children[name] else { throw FSError.notFound }
            // Refuse moving a directory below itself.
            var ancestor = newParent
            while true {
                if ancestor == source { throw FSError.invalid }
                if ancestor == FuseRootInode { break }
                ancestor = state.nodes[ancestor]!.parent
            }
            let target = to.children[newName]
            if target == source { return }
            if flags.contains(.exchange) {
                guard let target else { throw FSError.notFound }
                Self.link(&state, parent: parent, name: name, to: target)
                Self.link(&state, parent: newParent, name: newName, to: source)
                return
            }
            if let target {
                if flags.contains(.noReplace) { throw FSError.exists }
                let sourceIsDir = state.nodes[source]!.attributes.isDirectory
                let targetNode = state.nodes[target]!
                if targetNode.attributes.isDirectory {
                    guard sourceIsDir else { throw FSError.isDirectory }
                    guard targetNode.children.isEmpty else { throw FSError.notEmpty }
                } else if sourceIsDir {
                    throw FSError.notDirectory
                }
                Self.unlinkName(&state, parent: newParent, name: newName)
            }
            state.nodes[parent]!.children[name] = nil
            Self.touch(&state, parent)
            Self.link(&state, parent: newParent, name: newName, to: source)
        }
    }

    func link(inode: InodeNumber, newParent: InodeNumber, newName: String) throws -> Entry {
        try state.withLock { state in
            let dir = try Self.directory(state, newParent)
            guard let node = state.nodes[inode] else { throw FSError.notFound }
            guard !node.attributes.isDirectory else { throw FSError.notPermitted }
            guard dir.children[newName] == nil else { throw FSError.exists }
            Self.link(&state, parent: newParent, name: newName, to: inode)
            state.nodes[inode]!.attributes.linkCount += 1
            return Self.entry(&state, inode)
        }
    }

    func open(inode: InodeNumber, flags: Int32, context: RequestContext) throws -> OpenReply {
        try state.withLock { state in
            guard state.nodes[inode] != nil else { throw FSError.notFound }
            if flags & O_TRUNC != 0 {
                state.nodes[inode]!.data = []
                state.nodes[inode]!.attributes.size = 0
                Self.touch(&state, inode)
            }
            state.nodes[inode]!.openCount += 1
            let handle = state.nextHandle
            state.nextHandle += 1
            // As Coffer does: a read-only close needs no FLUSH.
            return OpenReply(handle: handle, noFlush: flags & O_ACCMODE == O_RDONLY)
        }
    }

    func read(inode: InodeNumber, handle: UInt64, offset: Int64, size: Int) throws -> [UInt8] {
        readHold.pass()
        return try state.withLock { state in
            guard let node = state.nodes[inode] else { throw FSError.notFound }
            let start = min(Int(offset), node.data.count)
            let end = min(start + size, node.data.count)
            return Array(node.data[start..<end])
        }
    }

    func write(inode: InodeNumber, handle: UInt64, offset: Int64, data: UnsafeRawBufferPointer) throws -> Int {
        writeHold.pass()
        return try state.withLock { state in
            guard state.nodes[inode] != nil else { throw FSError.notFound }
            let start = Int(offset)
            let end = start + data.count
            if state.nodes[inode]!.data.count < end {
                state.nodes[inode]!.data += [UInt8](repeating: 0, count: end - state.nodes[inode]!.data.count)
            }
            state.nodes[inode]!.data.replaceSubrange(start..<end, with: data)
            state.nodes[inode]!.attributes.size = UInt64(state.nodes[inode]!.data.count)
            Self.touch(&state, inode)
            return data.count
        }
    }

    func release(inode: InodeNumber, handle: UInt64, flags: Int32) throws {
        state.withLock { state in
            state.nodes[inode]?.openCount -= 1
            Self.collect(&state, inode)
        }
    }

    func create(
        parent: InodeNumber, name: String, mode: UInt32, flags: Int32, context: RequestContext
    ) throws -> (Entry, OpenReply) {
        try state.withLock { state in
            let ino = try Self.create(&state, parent: parent, name: name, mode: mode, context: context)
            state.nodes[ino]!.openCount += 1
            let handle = state.nextHandle
            state.nextHandle += 1
            return (Self.entry(&state, ino), OpenReply(handle: handle))
        }
    }

    func opendir(inode: InodeNumber, flags: Int32) throws -> OpenReply {
        try state.withLock { state in
            let dir = try Self.directory(state, inode)
            // Snapshot: cookies are indexes into this list, so concurrent
            // changes cannot make the listing skip or repeat names.
            var listing: [(name: String, inode: InodeNumber)] = [(".", inode), ("..", dir.parent)]
            listing += dir.children.sorted { $0.key < $1.key }.map { (name: $0.key, inode: $0.value) }
            let handle = state.nextHandle
            state.nextHandle += 1
            state.directorySnapshots[handle] = listing
            return OpenReply(handle: handle)
        }
    }

    func readdir(
        inode: InodeNumber, handle: UInt64, offset: Int64, maxEntries: Int, withAttributes: Bool
    ) throws -> [DirectoryEntry] {
        try state.withLock { state in
            if withAttributes { state.readdirPlusCalls += 1 } else { state.readdirCalls += 1 }
            guard let listing = state.directorySnapshots[handle] else { throw FSError.badHandle }
            var result: [DirectoryEntry] = []
            var index = Int(offset)
            while index < listing.count && result.count < maxEntries {
                let item = listing[index]
                index += 1
                // Names removed since opendir are skipped, not resurrected.
                guard let node = state.nodes[item.inode] else { continue }
                let entry = DirectoryEntry(
                    name: item.name, inode: item.inode, attributes: node.attributes, nextOffset: Int64(index))
                if withAttributes && !entry.isDotOrDotDot { state.nodes[item.inode]!.lookups += 1 }
                result.append(entry)
            }
            return result
        }
    }

    func releasedir(inode: InodeNumber, handle: UInt64) throws {
        state.withLock { _ = $0.directorySnapshots.removeValue(forKey: handle) }
    }

    /// This toy filesystem does not preallocate.
    func fallocate(inode: InodeNumber, handle: UInt64, mode: Int32, offset: Int64, length: Int64) throws {
        throw FSError.notSupported
    }

    func statfs(inode: InodeNumber) throws -> FileSystemStatistics {
        let files = state.withLock { UInt64($0.nodes.count) }
        return FileSystemStatistics(
            totalBlocks: 1 << 20, freeBlocks: 1 << 19, availableBlocks: 1 << 19,
            totalFiles: 1 << 20, freeFiles: (1 << 20) - files, availableFiles: (1 << 20) - files)
    }

    func setxattr(inode: InodeNumber, name: String, value: [UInt8], flags: XattrFlags) throws {
        try state.withLock { state in
            guard let node = state.nodes[inode] else { throw FSError.notFound }
            let exists = node.xattrs[name] != nil
            if flags.contains(.create) && exists { throw FSError.exists }
            if flags.contains(.replace) && !exists { throw FSError.noAttribute }
            state.nodes[inode]!.xattrs[name] = value
        }
    }

    func getxattr(inode: InodeNumber, name: String) throws -> [UInt8] {
        try state.withLock { state in
            state.getxattrNames.append(name)
            guard let node = state.nodes[inode] else { throw FSError.notFound }
            guard let value = node.xattrs[name] else { throw FSError.noAttribute }
            return value
        }
    }

    func listxattr(inode: InodeNumber) throws -> [String] {
        try state.withLock { state in
            guard let node = state.nodes[inode] else { throw FSError.notFound }
            return node.xattrs.keys.sorted()
        }
    }

    func removexattr(inode: InodeNumber, name: String) throws {
        try state.withLock { state in
            guard state.nodes[inode] != nil else { throw FSError.notFound }
            guard state.nodes[inode]!.xattrs.removeValue(forKey: name) != nil else { throw FSError.noAttribute }
        }
    }
}

/// Keeps a request inside its handler until the test lets it go: the handler calls `pass()`,
/// which waits while the hold is on.
final class RequestHold: Sendable {
    private let gate = Mutex<DispatchSemaphore?>(nil)
    private let waiting = Atomic<Int>(0)

    var isHeld: Bool { gate.withLock { $0 != nil } }
    /// Handlers waiting in `pass()` right now.
    var waitingCount: Int { waiting.load(ordering: .relaxed) }

    /// From now on handlers wait in `pass()`.
    func hold() { gate.withLock { $0 = DispatchSemaphore(value: 0) } }

    /// Ends the hold and lets the handler waiting in `pass()` go (the tests hold one at a time).
    func release() {
        gate.withLock { g in
            defer { g = nil }
            return g
        }?.signal()
    }

    /// Waits up to 5 s for a handler to arrive; whether one did.
    func awaitHandler() -> Bool {
        for _ in 0..<500 where waitingCount == 0 { usleep(10_000) }
        return waitingCount > 0
    }

    func pass() {
        guard let g = gate.withLock({ $0 }) else { return }
        waiting.add(1, ordering: .relaxed)
        g.wait()
        waiting.subtract(1, ordering: .relaxed)
    }
}
