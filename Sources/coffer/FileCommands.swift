import ArgumentParser
import CofferModel
import CofferVault
import Foundation

struct List: ParsableCommand {
    static let configuration = CommandConfiguration(commandName: "ls", abstract: "List a folder.")
    @OptionGroup var store: StoreOptions
    @Flag(name: .short, help: "Long format: mode, owner, size, modification time.") var l = false
    @Option(help: "Read PATH inside the share with this id (pending or accepted) instead.") var share: String?
    @Argument(help: "Folder or file (default: the root).") var path: String = "/"

    func run() throws {
        try guarded {
            let vault = try store.openVault()
            let node = try resolveForReading(vault, path, share: share)
            let entries = node.type == .folder ? try vault.children(of: node.id) : [node]
            for e in entries {
                let suffix =
                    e.type == .folder ? "/" : (e.type == .symlink ? " -> \(e.attributes.symlinkTarget ?? "")" : "")
                if l {
                    let owner = "\(pad(String(e.attributes.uid.value), 5)) \(pad(String(e.attributes.gid.value), 5))"
                    let when = timeString(e.attributes.mtime.value)
                    print("\(modeString(e.mode)) \(owner) \(pad(String(e.size), 12)) \(when) \(e.name)\(suffix)")
                } else {
                    print(e.name + (e.type == .folder ? "/" : ""))
                }
            }
        }
    }
}

func pad(_ s: String, _ n: Int) -> String { String(repeating: " ", count: max(0, n - s.count)) + s }

func modeString(_ mode: UInt32) -> String {
    let kind: Character =
        switch mode & 0o170000 {
        case 0o040000: "d"
        case 0o120000: "l"
        default: "-"
        }
    var s = String(kind)
    let bits: [(UInt32, Character)] = [
        (0o400, "r"), (0o200, "w"), (0o100, "x"), (0o040, "r"), (0o020, "w"), (0o010, "x"), (0o004, "r"), (0o002, "w"),
        (0o001, "x"),
    ]
    for (bit, c) in bits { s.append(mode & bit != 0 ? c : "-") }
    return s
}

func timeString(_ t: Timespec) -> String {
    var tt = time_t(t.seconds)
    var tmv = tm()
    localtime_r(&tt, &tmv)
    var buf = [CChar](repeating: 0, count: 32)
    let n = strftime(&buf, 32, "%Y-%m-%d %H:%M", &tmv)
    return String(decoding: buf[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self)
}

struct Tree: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Show a folder and everything below it.")
    @OptionGroup var store: StoreOptions
    @Argument(help: "Folder (default: the root).") var path: String = "/"

    func run() throws {
        try guarded {
            let vault = try store.openVault()
            let node = try vault.resolveAcrossShares(path)
            print(node.isRoot ? "/" : node.name)
            var folders = 0
            var files = 0
            func walk(_ id: FileID, _ prefix: String) throws {
                let kids = try vault.children(of: id)
                for (i, k) in kids.enumerated() {
                    let last = i == kids.count - 1
                    print(prefix + (last ? "└── " : "├── ") + k.name + (k.type == .folder ? "/" : ""))
                    if k.type == .folder {
                        folders += 1
                        try walk(k.id, prefix + (last ? "    " : "│   "))
                    } else {
                        files += 1
                    }
                }
            }
            if node.type == .folder { try walk(node.id, "") }
            print("\n\(folders) folders, \(files) files")
        }
    }
}

struct Cat: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Print a document's content.")
    @OptionGroup var store: StoreOptions
    @Option(help: "Read PATH inside the share with this id (pending or accepted) instead.") var share: String?
    @Argument var path: String

    func run() throws {
        try guarded {
            let vault = try store.openVault()
            let node = try resolveForReading(vault, path, share: share)
            guard node.type == .document else {
                throw node.type == .folder || node.type == .link
                    ? VaultError.tree(.isAFolder(path)) : VaultError.tree(.notADocument(path))
            }
            try vault.readContents(node.id) { piece in try writeAllBytes(1, piece) }
        }
    }
}

/// `path` in this account's tree, through accepted shares' links, or (`share`) inside the share
/// with that id.
func resolveForReading(_ vault: Vault, _ path: String, share: String?) throws -> Node {
    if let share { return try vault.sharedNode(try parseShareID(share), path: path) }
    return try vault.resolveAcrossShares(path)
}

func writeAllBytes(_ fd: Int32, _ bytes: [UInt8]) throws {
    var offset = 0
    while offset < bytes.count {
        let n = bytes.withUnsafeBytes { Glibc.write(fd, $0.baseAddress! + offset, bytes.count - offset) }
        if n < 0 {
            if errno == EINTR { continue }
            throw CLIError("write failed: \(String(cString: strerror(errno)))")
        }
        offset += n
    }
}

/// Reads from a file descriptor in pieces; nil at end of input.
func reader(_ fd: Int32, pieceSize: Int = 1 << 20) -> () throws -> [UInt8]? {
    return {
        var buf = [UInt8](repeating: 0, count: pieceSize)
        while true {
            let n = buf.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, pieceSize) }
            if n < 0 {
                if errno == EINTR { continue }
                throw CLIError("read failed: \(String(cString: strerror(errno)))")
            }
            if n == 0 { return nil }
            buf.removeLast(pieceSize - n)
            return buf
        }
    }
}

/// Finds or creates the document at `path` (its parent must exist).
func documentForWriting(_ vault: Vault, _ path: String, mode: UInt32 = 0o644) throws -> Node {
    let parts = Vault.components(path)
    guard let name = parts.last else { throw VaultError.tree(.isAFolder("/")) }
    let parentPath = "/" + parts.dropLast().joined(separator: "/")
    let parent = try vault.resolveAcrossShares(parentPath)
    guard parent.type == .folder else { throw VaultError.tree(.notAFolder(parentPath)) }
    if let existing = try vault.lookup(parent.id, name) {
        guard existing.type == .document else {
            throw existing.type == .folder ? VaultError.tree(.isAFolder(path)) : VaultError.tree(.notADocument(path))
        }
        return existing
    }
    return try vault.create(in: parent.id, name: name, type: .document, mode: mode)
}

struct Write: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Write stdin to a document (created if missing, else replaced).")
    @OptionGroup var store: StoreOptions
    @Argument var path: String

    func run() throws {
        try guarded {
            let vault = try store.openVault()
            let node = try documentForWriting(vault, path)
            try vault.writeContents(node.id, from: reader(0))
        }
    }
}

struct MakeFolder: ParsableCommand {
    static let configuration = CommandConfiguration(commandName: "mkdir", abstract: "Create a folder.")
    @OptionGroup var store: StoreOptions
    @Flag(name: .short, help: "Create missing parents; no error if it exists.") var p = false
    @Argument var paths: [String]

    func run() throws {
        try guarded {
            let vault = try store.openVault()
            for path in paths {
                if p {
                    try vault.makeFolders(path)
                    continue
                }
                let parts = Vault.components(path)
                guard let name = parts.last else { throw VaultError.tree(.pathConflict("/")) }
                let parent = try vault.resolveAcrossShares("/" + parts.dropLast().joined(separator: "/"))
                try vault.create(in: parent.id, name: name, type: .folder, mode: 0o755)
            }
        }
    }
}

struct Move: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "mv", abstract: "Rename or move a file or folder.",
        discussion:
            "If DST is an existing folder, SRC moves into it. An existing file at DST is an error unless --force.")
    @OptionGroup var store: StoreOptions
    @Flag(name: .shortAndLong, help: "Replace an existing file at the destination.") var force = false
    @Argument var source: String
    @Argument var destination: String

    func run() throws {
        try guarded {
            let vault = try store.openVault()
            let src = try vault.resolveAcrossShares(source)
            var parentNode: Node
            var name: String
            if let dst = try? vault.resolveAcrossShares(destination), dst.type == .folder, dst.id != src.id {
                parentNode = dst
                name = src.name
            } else {
                let parts = Vault.components(destination)
                guard let last = parts.last else { throw VaultError.tree(.rootModified) }
                parentNode = try vault.resolveAcrossShares("/" + parts.dropLast().joined(separator: "/"))
                name = last
            }
            guard parentNode.type == .folder else { throw VaultError.tree(.notAFolder(destination)) }
            try vault.rename(src.id, to: parentNode.id, name: name, mode: force ? .replace : .noReplace)
        }
    }
}

struct Remove: ParsableCommand {
    static let configuration = CommandConfiguration(commandName: "rm", abstract: "Delete files or folders.")
    @OptionGroup var store: StoreOptions
    @Flag(name: .short, help: "Delete folders and everything in them.") var r = false
    @Argument var paths: [String]

    func run() throws {
        try guarded {
            let vault = try store.openVault()
            for path in paths {
                let node = try vault.resolveAcrossShares(path)
                if node.type == .folder && !r { throw CLIError("\(path) is a folder; use rm -r") }
                try vault.remove(node.id, recursive: r)
            }
        }
    }
}

struct Edit: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Edit a document with $COFFER_EDITOR or $EDITOR.",
        discussion:
            "The plaintext copy lives in a private folder in memory (/dev/shm or $XDG_RUNTIME_DIR)"
            + " and is removed afterwards."
    )
    @OptionGroup var store: StoreOptions
    @Argument var path: String

    func run() throws {
        try guarded {
            let env = ProcessInfo.processInfo.environment
            guard
                let editor = env["COFFER_EDITOR"].flatMap({ $0.isEmpty ? nil : $0 })
                    ?? env["EDITOR"].flatMap({ $0.isEmpty ? nil : $0 })
            else {
                throw CLIError("set $COFFER_EDITOR or $EDITOR to choose an editor")
            }
            let vault = try store.openVault()
            let node = try documentForWriting(vault, path)
            let before = try vault.readAll(node.id)
            let dir = try privateTemporaryDirectory()
            defer { try? FileManager.default.removeItem(atPath: dir) }
            let file = dir + "/" + node.name
            guard
                FileManager.default.createFile(
                    atPath: file, contents: Data(before), attributes: [.posixPermissions: 0o600])
            else {
                throw CLIError("cannot create a temporary copy in \(dir)")
            }
            let status = runShell("\(editor) \"$1\"", file)
            guard status == 0 else { throw CLIError("editor exited with status \(status); document left unchanged") }
            guard let after = FileManager.default.contents(atPath: file) else {
                throw CLIError("the edited copy disappeared; document left unchanged")
            }
            if [UInt8](after) != before { try vault.writeAll(node.id, [UInt8](after)) }
        }
    }
}

/// A 0700 folder on a memory filesystem when one exists, so plaintext never reaches the disk.
func privateTemporaryDirectory() throws -> String {
    let env = ProcessInfo.processInfo.environment
    let candidates = [env["XDG_RUNTIME_DIR"], "/dev/shm", NSTemporaryDirectory()].compactMap { $0 }.filter {
        !$0.isEmpty
    }
    for base in candidates where FileManager.default.isWritableFile(atPath: base) {
        var template = Array((base + "/coffer-edit-XXXXXX").utf8CString)
        if let p = mkdtemp(&template) { return String(cString: p) }
    }
    throw CLIError("cannot create a private temporary folder")
}

func runShell(_ command: String, _ arg: String) -> Int32 {
    let p = Process()
    p.executableURL = URL(fileURLWithPath: "/bin/sh")
    p.arguments = ["-c", command, "sh", arg]
    do { try p.run() } catch { return 127 }
    p.waitUntilExit()
    return p.terminationStatus
}
