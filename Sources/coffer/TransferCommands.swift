import ArgumentParser
import CofferModel
import CofferSync
import CofferVault
import Foundation
import Synchronization

/// A one-line progress bar on stderr, only when stderr is a terminal.
final class Progress {
    let total: Int
    let enabled: Bool
    var done = 0
    var bytes: UInt64 = 0
    var lastDraw = 0.0

    init(total: Int) {
        self.total = total
        enabled = isatty(2) == 1
    }

    func step(bytes b: UInt64 = 0) {
        done += 1
        bytes += b
        guard enabled else { return }
        let now = Date().timeIntervalSince1970
        if now - lastDraw < 0.1 && done < total { return }
        lastDraw = now
        let width = 30
        let filled = total == 0 ? width : width * done / max(total, 1)
        let bar = String(repeating: "#", count: filled) + String(repeating: " ", count: width - filled)
        FileHandle.standardError.write(Data("\r[\(bar)] \(done)/\(total) files, \(bytes / 1_048_576) MiB".utf8))
    }

    func finish() {
        if enabled { FileHandle.standardError.write(Data("\n".utf8)) }
    }
}

struct Import: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Copy a local file or folder into Coffer (recursive, keeps mode, atime and mtime).")
    @OptionGroup var store: StoreOptions
    @Argument(help: "Local file or folder.") var local: String
    @Argument(help: "Destination in Coffer: an existing folder to copy into, or a new name.") var destination: String

    func run() throws {
        try guarded {
            let vault = try store.openVault()
            let src = absolute(local)
            var st = stat()
            guard lstat(src, &st) == 0 else {
                throw CLIError("cannot read \(local): \(String(cString: strerror(errno)))")
            }
            let base = URL(fileURLWithPath: src).lastPathComponent
            let parent: Node
            let name: String
            if let dst = try? vault.resolveAcrossShares(destination), dst.type == .folder {
                parent = dst
                name = base
            } else {
                let parts = Vault.components(destination)
                guard let last = parts.last else { throw CLIError("invalid destination \(destination)") }
                parent = try vault.resolveAcrossShares("/" + parts.dropLast().joined(separator: "/"))
                name = last
            }
            if try vault.lookup(parent.id, name) != nil {
                throw VaultError.tree(.pathConflict(vault.path(of: parent.id) + "/" + name))
            }
            let progress = Progress(total: countEntries(src))
            // Many small files: share commits as the mount does (a group every 50-500 ms, its
            // statements run on the other core), then make everything durable once at the end.
            try vault.mark(.import, running: true)
            vault.enableGroupCommit()
            let lostBefore = vault.lostGroups.load(ordering: .relaxed)
            do {
                try importEntry(vault, src, into: parent.id, name: name, progress)
                try vault.disableGroupCommit()
            } catch {
                try? vault.disableGroupCommit()
                throw error
            }
            try vault.makeDurable()
            // A group that failed to commit took files already counted as copied with it.
            try vault.noticeLostGroup()
            guard vault.lostGroups.load(ordering: .relaxed) == lostBefore else {
                throw CLIError("a commit failed during the import and some files were not stored; run it again")
            }
            try vault.mark(.import, running: false)
            progress.finish()
        }
    }

    func countEntries(_ path: String) -> Int {
        var n = 1
        if let e = FileManager.default.enumerator(atPath: path) { while e.nextObject() != nil { n += 1 } }
        return n
    }

    func importEntry(_ vault: Vault, _ path: String, into parent: FileID, name: String, _ progress: Progress) throws {
        var st = stat()
        guard lstat(path, &st) == 0 else { throw CLIError("cannot read \(path): \(String(cString: strerror(errno)))") }
        let mode = UInt32(st.st_mode) & 0o7777
        let mtime = Timespec(seconds: Int64(st.st_mtim.tv_sec), nanoseconds: Int64(st.st_mtim.tv_nsec))
        // Taken before the content is read, which may move the source's atime.
        let atime = Timespec(seconds: Int64(st.st_atim.tv_sec), nanoseconds: Int64(st.st_atim.tv_nsec))
        switch st.st_mode & S_IFMT {
        case S_IFDIR:
            let folder = try vault.create(
                in: parent, name: name, type: .folder, mode: mode, uid: st.st_uid, gid: st.st_gid, atime: atime)
            progress.step()
            let entries = try FileManager.default.contentsOfDirectory(atPath: path).sorted()
            for e in entries { try importEntry(vault, path + "/" + e, into: folder.id, name: e, progress) }
            // Set last: adding children touched the folder's mtime.
            try vault.setAttributes(folder.id, AttributeChanges(mtime: mtime))
        case S_IFREG:
            let fd = open(path, O_RDONLY | O_CLOEXEC)
            guard fd >= 0 else { throw CLIError("cannot open \(path): \(String(cString: strerror(errno)))") }
            defer { close(fd) }
            let doc = try vault.create(
                in: parent, name: name, type: .document, mode: mode, uid: st.st_uid, gid: st.st_gid, atime: atime)
            try vault.writeContents(doc.id, mtime: mtime, durable: false, from: reader(fd))
            progress.step(bytes: UInt64(st.st_size))
        case S_IFLNK:
            var buf = [CChar](repeating: 0, count: 4097)
            let n = readlink(path, &buf, 4096)
            guard n > 0 else { throw CLIError("cannot read link \(path)") }
            let target = String(decoding: buf[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self)
            try vault.create(
                in: parent, name: name, type: .symlink, mode: 0o777, uid: st.st_uid, gid: st.st_gid,
                symlinkTarget: target, mtime: mtime, atime: atime)
            progress.step()
        default:
            printErr("coffer: skipping \(path): not a regular file, folder or symlink")
            progress.step()
        }
    }
}

struct Export: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Copy a file or folder out of Coffer into a local folder (recursive, keeps mode, atime and mtime).",
        discussion: """
            Files belong to the user running the command (ownership is not restored), so, \
            as cp does, setuid and setgid bits are not kept.
            """)
    @OptionGroup var store: StoreOptions
    @Argument(help: "File or folder in Coffer.") var source: String
    @Argument(help: "Local folder to copy into (created, with its parents, if missing).") var localFolder: String

    func run() throws {
        try guarded {
            let vault = try store.openVault()
            let node = try vault.resolveAcrossShares(source)
            let dest = absolute(localFolder)
            var isDir: ObjCBool = false
            if !FileManager.default.fileExists(atPath: dest, isDirectory: &isDir) {
                do {
                    try FileManager.default.createDirectory(atPath: dest, withIntermediateDirectories: true)
                } catch {
                    throw CLIError("cannot create \(localFolder): \((error as NSError).localizedDescription)")
                }
            } else if !isDir.boolValue {
                throw CLIError("\(localFolder) is not a folder")
            }
            let name = node.isRoot ? vault.username : node.name
            let target = dest + "/" + name
            if FileManager.default.fileExists(atPath: target) { throw CLIError("\(target) already exists") }
            let progress = Progress(total: countNodes(vault, node))
            try exportNode(vault, node, to: target, progress)
            progress.finish()
        }
    }

    func countNodes(_ vault: Vault, _ node: Node) -> Int {
        guard node.type == .folder, let kids = try? vault.children(of: node.id) else { return 1 }
        return 1 + kids.reduce(0) { $0 + countNodes(vault, $1) }
    }

    /// utimensat's pair: atime, then mtime.
    func times(_ a: PosixAttributes) -> [timespec] {
        [a.atime.value, a.mtime.value].map { timespec(tv_sec: Int($0.seconds), tv_nsec: Int($0.nanoseconds)) }
    }

    func setTimes(_ path: String, _ a: PosixAttributes) {
        var t = times(a)
        utimensat(AT_FDCWD, path, &t, AT_SYMLINK_NOFOLLOW)
    }

    func exportNode(_ vault: Vault, _ node: Node, to path: String, _ progress: Progress) throws {
        // Ownership is not restored (the files belong to whoever exports), so setuid and setgid
        // go, as with cp: a root export of another user's 6755 file must not make it setuid root.
        let mode = node.attributes.mode.value & 0o7777 & ~UInt32(S_ISUID | S_ISGID)
        switch node.type {
        case .folder:
            guard mkdir(path, 0o700) == 0 else {
                throw CLIError("cannot create \(path): \(String(cString: strerror(errno)))")
            }
            progress.step()
            for child in try vault.children(of: node.id) {
                try exportNode(vault, child, to: path + "/" + child.name, progress)
            }
            chmod(path, mode_t(mode))
            setTimes(path, node.attributes)
        case .document:
            let fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
            guard fd >= 0 else { throw CLIError("cannot create \(path): \(String(cString: strerror(errno)))") }
            defer { close(fd) }
            try vault.readContents(node.id) { try writeAllBytes(fd, $0) }
            fchmod(fd, mode_t(mode))
            var t = times(node.attributes)
            futimens(fd, &t)
            progress.step(bytes: node.size)
        case .symlink:
            guard symlink(node.attributes.symlinkTarget ?? "", path) == 0 else {
                throw CLIError("cannot create link \(path): \(String(cString: strerror(errno)))")
            }
            setTimes(path, node.attributes)
            progress.step()
        case .link:
            progress.step()
        }
    }
}

struct Status: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Show the store, pending changes, sync and mount state.",
        discussion:
            "With --json, one JSON object for scripts (times in ms since the epoch; `sync`, `live` and `mounted` "
            + "absent without a server or a mount); the fields are documented in docs/SYNC.md, \"Status\"."
    )
    @OptionGroup var store: StoreOptions
    @Flag(help: "Print one JSON object instead of text.") var json = false

    func run() throws {
        try guarded {
            let vault = try store.openVault()
            let report = try StatusReport(vault)
            if json {
                let encoder = JSONEncoder()
                encoder.outputFormatting = [.sortedKeys]
                print(String(decoding: try encoder.encode(report), as: UTF8.self))
            } else {
                report.printText()
            }
        }
    }
}

/// What `coffer status` reports, as text or as JSON (docs/SYNC.md, "Status"). Every string that
/// came from a server went through `ServerText.sanitized`.
struct StatusReport: Encodable {
    struct Pending: Encodable {
        var created: Int
        var modified: Int
        var deleted: Int
        /// Changes in other accounts' shares not pushed yet.
        var shared: Int
        /// Files from shares this account can no longer write to, waiting to be saved in its tree.
        var saving: Int
        /// Sealed bytes of content not pushed yet.
        var bytesUp: Int
    }
    struct Sync: Encodable {
        var server: String
        var lastSuccess: Int64?
        var lastAttempt: Int64?
        var cursor: Int64
        var lastError: String?
        var notice: String?
    }
    struct Live: Encodable {
        var state: String
        var since: Int64
        var detail: String?
    }
    struct Mounted: Encodable {
        var mountPoint: String
        var pid: Int32
    }

    struct Unfetched: Encodable {
        var path: String
        var time: Int64
        var why: String
    }
    /// Content kept on demand: whether, what is pinned, what a read could not fetch.
    struct Content: Encodable {
        var onDemand: Bool
        var pinned: [String]
        var unfetched: [Unfetched]
    }

    var account: String
    var accountID: String
    var content: Content
    var store: String
    var files: Int
    var pending: Pending
    var recovered: [String]
    /// nil without a server (local only).
    var sync: Sync?
    /// The mount daemon's live channel; nil when not mounted or without a server.
    var live: Live?
    var mounted: Mounted?

    init(_ vault: Vault) throws {
        account = vault.username
        accountID = "\(vault.accountID)"
        store = vault.dataDirectory
        files = vault.fileCount
        let counts = try vault.pendingChanges()
        pending = Pending(
            created: counts.created, modified: counts.modified, deleted: counts.deleted,
            shared: try vault.pendingSharedChanges(), saving: vault.recoveryWaiting,
            bytesUp: try vault.pendingUploadBytes())
        recovered = vault.recoveredFromShares
        content = Content(
            onDemand: vault.isOnDemand, pinned: vault.pinnedIDs.map { vault.path(of: $0) },
            unfetched: vault.unfetched.map {
                Unfetched(path: vault.path(of: $0.id), time: $0.millis, why: ServerText.sanitized($0.why))
            })
        let status = vault.syncStatus
        sync = status.server.map { server in
            Sync(
                server: server, lastSuccess: status.lastSuccessMillis, lastAttempt: status.lastAttemptMillis,
                cursor: status.cursor, lastError: status.lastError.map { ServerText.sanitized($0, limit: 1000) },
                notice: vault.serverCatchUpNotice.map { ServerText.sanitized($0) })
        }
        if MountLock.isHeld(in: vault.dataDirectory), let m = MountLock.recorded(in: vault.dataDirectory) {
            mounted = Mounted(mountPoint: m.mountPoint, pid: m.pid)
            if status.server != nil, let l = vault.liveChannel {
                live = Live(
                    state: ServerText.sanitized(l.state, limit: 32), since: l.sinceMillis,
                    detail: l.detail.map { ServerText.sanitized($0) })
            }
        }
    }

    func printText() {
        print("account:  \(account) (\(accountID))")
        print("store:    \(store)")
        print("files:    \(files)")
        print(
            "pending:  \(pending.created) created, \(pending.modified) modified, \(pending.deleted) deleted (not "
                + "yet synced)" + (pending.bytesUp > 0 ? ", \(pending.bytesUp) bytes to upload" : "")
        )
        if pending.shared > 0 { print("shared:   \(pending.shared) changes in shares not yet synced") }
        if pending.saving > 0 {
            print("saving:   \(pending.saving) files from shares wait to be saved in your tree (next sync)")
        }
        for path in recovered { print("recovered: \(path) (written in a share this account can no longer write to)") }
        if content.onDemand {
            let pins = content.pinned.isEmpty ? "nothing pinned" : "pinned: " + content.pinned.joined(separator: ", ")
            print("content:  on demand (\(pins))")
        }
        for u in content.unfetched {
            print("unfetched: \(u.path) at \(timeString(Timespec(seconds: u.time / 1000))): \(u.why)")
        }
        if let sync {
            let last = sync.lastSuccess.map { timeString(Timespec(seconds: $0 / 1000)) } ?? "never"
            print("sync:     \(sync.server), last success \(last), server version \(sync.cursor)")
            if let n = sync.notice { print("notice:   \(n)") }
            if let e = sync.lastError { print("error:    last attempt failed: \(e)") }
        } else {
            print("sync:     no server configured (local only)")
        }
        if let mounted {
            print("mounted:  \(mounted.mountPoint) (pid \(mounted.pid))")
            if let live {
                let why = live.detail.map { ": " + $0 } ?? ""
                print("live channel: \(live.state) since \(timeString(Timespec(seconds: live.since / 1000)))\(why)")
            }
        } else {
            print("mounted:  no")
        }
    }
}

struct Fsck: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Check invariants, signatures and every chunk.")
    @OptionGroup var store: StoreOptions

    func run() throws {
        try guarded {
            let vault = try store.openVault()
            let r = try vault.check()
            print(
                "\(r.files) files, \(r.documents) documents, \(r.chunksVerified) chunks (\(r.bytesVerified) bytes) "
                    + "verified"
            )
            if r.unreferencedChunks + r.unreferencedManifests > 0 {
                print(
                    "\(r.unreferencedChunks) unreferenced chunks and \(r.unreferencedManifests) manifests (from "
                        + "interrupted writes; `coffer gc` reclaims them)"
                )
            }
            if r.isClean {
                print("clean")
            } else {
                for p in r.problems { printErr("problem: \(p)") }
                throw CLIError("\(r.problems.count) problems found")
            }
        }
    }
}

struct GarbageCollect: ParsableCommand {
    static let configuration = CommandConfiguration(commandName: "gc", abstract: "Remove content nothing refers to.")
    @OptionGroup var store: StoreOptions

    func run() throws {
        try guarded {
            let vault = try store.openVault()
            guard let r = try vault.collectGarbage() else {
                throw CLIError("the store is in use (mounted or another command is running); try again later")
            }
            print(
                "removed \(r.chunks) chunks and \(r.manifests) manifests; rewrote \(r.compactedPacks) mostly unused "
                    + "pack\(r.compactedPacks == 1 ? "" : "s")"
            )
        }
    }
}

/// A sync's progress on a terminal (stderr, when it is one): a line per step, redrawn at most
/// ten times a second, ended when the next step begins or the sync ends.
final class SyncProgressBar: Sendable {
    private struct State {
        var step: String?
        var lastDraw = 0.0
    }
    private let state = Mutex(State())
    let enabled = isatty(2) == 1

    /// Draws `progress` on the terminal; nothing when stderr is not one.
    func show(_ p: SyncProgress) {
        guard enabled else { return }
        let line = state.withLock { s -> String? in
            let now = Date().timeIntervalSince1970
            var prefix = ""
            if s.step != p.step {
                if s.step != nil { prefix = "\n" }
                s.step = p.step
            } else if now - s.lastDraw < 0.1 && p.done < p.total {
                return nil
            }
            s.lastDraw = now
            let width = 30
            let filled = p.total == 0 ? width : min(width, width * p.done / max(p.total, 1))
            let bar = String(repeating: "#", count: filled) + String(repeating: " ", count: width - filled)
            let mib = p.bytes > 0 ? ", \(p.bytes / 1_048_576) MiB" : ""
            return prefix + "\r\(p.step) [\(bar)] \(p.done)/\(p.total)\(mib)"
        }
        if let line { FileHandle.standardError.write(Data(line.utf8)) }
    }

    func finish() {
        guard enabled, state.withLock({ $0.step != nil }) else { return }
        FileHandle.standardError.write(Data("\n".utf8))
    }
}
