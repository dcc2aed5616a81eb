import CofferCrypto
import CofferModel
import Foundation
import Testing

@testable import CofferStore
@testable import CofferVault

/// A temp data directory with a fresh vault; the directory is removed on deinit.
final class VaultFixture: @unchecked Sendable {
    let dir: String
    let dataDir: String
    let vault: Vault

    init(username: String = "alice") throws {
        dir = NSTemporaryDirectory() + "coffer-vault-test-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        dataDir = dir + "/data"
        vault = try Vault.create(dataDirectory: dataDir, username: username)
    }

    deinit { try? FileManager.default.removeItem(atPath: dir) }

    var root: FileID { vault.rootID }

    @discardableResult
    func folder(_ name: String, in parent: FileID? = nil) throws -> Node {
        try vault.create(in: parent ?? root, name: name, type: .folder, mode: 0o755)
    }

    @discardableResult
    func document(_ name: String, in parent: FileID? = nil, contents: [UInt8]? = nil) throws -> Node {
        let n = try vault.create(in: parent ?? root, name: name, type: .document, mode: 0o644)
        if let contents { try vault.writeAll(n.id, contents) }
        return n
    }

    func names(_ parent: FileID? = nil) throws -> [String] {
        try vault.children(of: parent ?? root).map(\.name)
    }

    func chunkCount() throws -> Int { try vault.store.read { try $0.count("SELECT COUNT(*) FROM chunks") } }

    /// Runs SQL on the store with the sqlite3 command-line tool (the store exposes no raw writes).
    func sqlite(_ sql: String) throws -> String {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/bin/sqlite3")
        p.arguments = [dataDir + "/coffer.sqlite", sql]
        let out = Pipe()
        p.standardOutput = out
        p.standardError = out
        try p.run()
        let data = out.fileHandleForReading.readDataToEndOfFile()
        p.waitUntilExit()
        let text = String(decoding: data, as: UTF8.self)
        guard p.terminationStatus == 0 else { throw VaultError.io("sqlite3 failed: \(text)") }
        return text
    }
}

/// Asserts that `body` throws a VaultError with this errno, and returns the error.
@discardableResult
func expectErrno(
    _ errno: Int32, _ comment: Comment? = nil, sourceLocation: SourceLocation = #_sourceLocation,
    _ body: () throws -> Void
) -> VaultError? {
    do {
        try body()
        Issue.record(
            "expected errno \(errno), but nothing was thrown. \(comment.map { "\($0)" } ?? "")",
            sourceLocation: sourceLocation)
        return nil
    } catch let e as VaultError {
        #expect(e.errno == errno, "\(e) \(comment.map { "\($0)" } ?? "")", sourceLocation: sourceLocation)
        return e
    } catch {
        Issue.record("expected a VaultError, got \(type(of: error)): \(error)", sourceLocation: sourceLocation)
        return nil
    }
}

/// The tree error inside a vault error, if any.
func treeError(_ e: VaultError?) -> TreeError? {
    if case .tree(let t)? = e { return t }
    return nil
}

/// Deterministic, non-repeating pseudo-random bytes.
func noise(_ count: Int, seed: UInt64) -> [UInt8] {
    var out = [UInt8](repeating: 0, count: count)
    var s = seed | 1
    out.withUnsafeMutableBytes { raw in
        let words = raw.bindMemory(to: UInt64.self)
        for i in 0..<words.count {
            s ^= s << 13
            s ^= s >> 7
            s ^= s << 17
            words[i] = s
        }
    }
    return out
}

func containsBytes(_ haystack: [UInt8], _ needle: [UInt8]) -> Bool {
    guard haystack.count >= needle.count, let first = needle.first else { return false }
    return haystack.withUnsafeBufferPointer { h in
        var i = 0
        let last = h.count - needle.count
        while i <= last {
            if h[i] == first {
                var j = 1
                while j < needle.count && h[i + j] == needle[j] { j += 1 }
                if j == needle.count { return true }
            }
            i += 1
        }
        return false
    }
}
