import CofferCrypto
import CofferModel
import CofferSync
import CofferTestSupport
import CofferVault
import Foundation
import Testing

/// One device: a vault in its own data directory, syncing with the world's server.
final class Device: @unchecked Sendable {
    let name: String
    let vault: Vault
    let engine: SyncEngine

    init(name: String, vault: Vault, server: String) {
        self.name = name
        self.vault = vault
        self.engine = SyncEngine(vault: vault, transport: HTTPTransport(baseURL: server))
    }

    func sync() async throws { try await engine.sync() }

    // Path-based operations, as a user would do them.
    func mkdir(_ path: String) throws { try vault.makeFolders(path) }

    func write(_ path: String, _ text: String) throws { try write(path, Array(text.utf8)) }

    func write(_ path: String, _ bytes: [UInt8]) throws {
        let parts = Vault.components(path)
        let parent = try vault.resolve("/" + parts.dropLast().joined(separator: "/"))
        let name = parts.last ?? ""
        let node =
            try vault.lookup(parent.id, name) ?? vault.create(in: parent.id, name: name, type: .document, mode: 0o644)
        try vault.writeAll(node.id, bytes)
    }

    func read(_ path: String) throws -> String {
        String(decoding: try vault.readAll(vault.resolve(path).id), as: UTF8.self)
    }

    func exists(_ path: String) -> Bool { (try? vault.resolve(path)) != nil }

    func mv(_ from: String, _ to: String) throws {
        let src = try vault.resolve(from)
        let parts = Vault.components(to)
        let parent = try vault.resolve("/" + parts.dropLast().joined(separator: "/"))
        try vault.rename(src.id, to: parent.id, name: parts.last ?? "", mode: .noReplace)
    }

    func rm(_ path: String) throws { try vault.remove(vault.resolve(path).id, recursive: true) }

    func chmod(_ path: String, _ mode: UInt32) throws {
        try vault.setAttributes(vault.resolve(path).id, AttributeChanges(mode: mode))
    }

    func touch(_ path: String, _ seconds: Int64) throws {
        try vault.setAttributes(vault.resolve(path).id, AttributeChanges(mtime: Timespec(seconds: seconds)))
    }

    /// `touch -a`.
    func touchAccess(_ path: String, _ seconds: Int64) throws {
        try vault.setAttributes(vault.resolve(path).id, AttributeChanges(atime: Timespec(seconds: seconds)))
    }

    func symlink(_ path: String, _ target: String) throws {
        let parts = Vault.components(path)
        let parent = try vault.resolve("/" + parts.dropLast().joined(separator: "/"))
        try vault.create(in: parent.id, name: parts.last ?? "", type: .symlink, mode: 0o777, symlinkTarget: target)
    }

    func setXattr(_ path: String, _ name: String, _ value: String?) throws {
        try vault.setXattr(vault.resolve(path).id, name: name, value: value.map { Array($0.utf8) })
    }

    func xattrs(_ path: String) throws -> [String: String] {
        try vault.xattrs(vault.resolve(path).id).mapValues { String(decoding: $0, as: UTF8.self) }
    }

    func mtime(_ path: String) throws -> Int64 { try vault.resolve(path).attributes.mtime.value.seconds }

    func atime(_ path: String) throws -> Int64 { try vault.resolve(path).attributes.atime.value.seconds }

    func mode(_ path: String) throws -> UInt32 { try vault.resolve(path).attributes.mode.value }

    func ls(_ path: String = "/") throws -> [String] { try vault.children(of: vault.resolve(path).id).map(\.name) }

    /// The whole tree as path → description (type, content, mode, times, xattrs).
    func snapshot() throws -> [String: String] {
        var out: [String: String] = [:]
        func walk(_ node: Node, _ path: String) throws {
            for c in try vault.children(of: node.id) {
                let p = path + "/" + c.name
                let a = c.attributes
                let xattrs = a.liveXattrs.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }
                var d = "\(c.type) mode=\(String(a.mode.value, radix: 8)) uid=\(a.uid.value)"
                d += " mtime=\(a.mtime.value.seconds).\(a.mtime.value.nanoseconds)"
                d += " atime=\(a.atime.value.seconds).\(a.atime.value.nanoseconds) x=\(xattrs)"
                switch c.type {
                case .document: d += " content=\(blake2b(try vault.readAll(c.id)).prefix(8))" + " size=\(c.size)"
                case .symlink: d += " target=\(a.symlinkTarget ?? "")"
                case .folder: try walk(c, p)
                case .link: break
                }
                out[p] = d
            }
        }
        try walk(try vault.resolve("/"), "")
        return out
    }

    /// Changes not pushed yet: to the account's own tree and, as a grantee, to shares.
    var pending: Int { (try? vault.pendingRecords().count + vault.pendingSharedChanges()) ?? -1 }
}

/// A server and some devices of one account.
final class SyncWorld: @unchecked Sendable {
    let tmp = TemporaryDirectory("coffer-sync")
    let server: ServerProcess
    var devices: [Device] = []

    /// A new account with `count` devices, on its own server unless one is given.
    init(devices count: Int = 2, server shared: ServerProcess? = nil, username: String? = nil) async throws {
        server = try shared ?? ServerProcess(dataDirectory: tmp.sub("server"))
        let secret = AccountSecret.generate()
        let username = username ?? "user\(UInt32.random(in: 0...UInt32.max))"
        let first = try Vault.create(dataDirectory: tmp.sub("device0"), username: username, secret: secret)
        try first.setServer(server.url)
        let a = Device(name: "A", vault: first, server: server.url)
        try await a.engine.register()
        try await a.sync()
        devices.append(a)
        for i in 1..<count {
            let v = try Vault.create(
                dataDirectory: tmp.sub("device\(i)"), username: username, secret: secret, createRoot: false)
            try v.setServer(server.url)
            let d = Device(name: String(UnicodeScalar(UInt8(65 + i))), vault: v, server: server.url)
            try await d.sync()
            devices.append(d)
        }
    }

    var a: Device { devices[0] }
    var b: Device { devices[1] }
    var c: Device { devices[2] }

    /// Syncs the devices in the given order, e.g. `sync(a, b, a, b)`.
    func sync(_ order: Device...) async throws {
        for d in order { try await d.sync() }
    }

    /// Syncs everyone twice more, then checks: equal trees, clean fsck, nothing pending.
    func expectConverged(sourceLocation: SourceLocation = #_sourceLocation) async throws {
        for _ in 0..<2 { for d in devices { try await d.sync() } }
        let first = try devices[0].snapshot()
        for d in devices {
            let snap = try d.snapshot()
            #expect(
                snap == first, "device \(d.name) differs: \(Self.diff(first, snap))", sourceLocation: sourceLocation)
            let report = try d.vault.check()
            #expect(report.isClean, "device \(d.name): \(report.problems)", sourceLocation: sourceLocation)
            #expect(d.pending == 0, "device \(d.name) has pending changes", sourceLocation: sourceLocation)
        }
        let audit = server.audit()
        #expect(
            audit.status == 0 && audit.out.contains("audit: clean"), "server audit: \(audit.out) \(audit.err)",
            sourceLocation: sourceLocation)
    }

    static func diff(_ a: [String: String], _ b: [String: String]) -> String {
        var lines: [String] = []
        for k in Set(a.keys).union(b.keys).sorted() where a[k] != b[k] {
            lines.append("\(k): \(a[k] ?? "-") | \(b[k] ?? "-")")
        }
        return lines.prefix(10).joined(separator: "; ")
    }
}
