import CofferCrypto
import CofferModel
import CofferProtocol
import CofferServerCore
import Foundation
import Synchronization
import Testing

/// An account's keys for tests.
struct TestUser: Sendable {
    let keys: SigningKeyPair
    let boxKey: Data
    let id: AccountID
    var key: Data { Data(keys.publicKey.bytes) }
    let username: String

    init(_ username: String = "user\(Int.random(in: 0..<1_000_000_000))") {
        let secret = AccountSecret.generate()
        keys = secret.signingKeys
        boxKey = Data(secret.boxKeys.publicKey.bytes)
        // The key is 32 bytes by construction.
        id = try! AccountID(bytes: secret.signingKeys.publicKey.bytes)
        self.username = username
    }

    var createRequest: CreateAccountRequest {
        CreateAccountRequest(username: username, signingKey: key, boxKey: boxKey)
    }

    /// Signs `m` with a revision above every earlier one of this process, as a device's pushes
    /// are above the records they were based on.
    func sign(_ m: FileMetadata, revision: UInt64? = nil) -> Data {
        let r =
            revision
            ?? nextRevision.withLock {
                $0 += 1
                return $0
            }
        return Data(
            SignedMetadata(
                metadata: m, revision: r, signature: keys.sign(SignedMetadata.message(metadata: m, revision: r))
            ).encoded())
    }
}

let nextRevision = Mutex<UInt64>(0)

func newFileID() -> FileID { try! FileID(random: randomBytes(16)) }

/// A sealed name whose MAC follows the plaintext, so equal names collide as on a real device.
func sealedName(_ plain: String) -> SealedName {
    SealedName(ciphertext: randomBytes(40), mac: blake2b(Array(plain.utf8)))
}

func rootRecord(_ u: TestUser, id: FileID = newFileID()) -> FileMetadata {
    FileMetadata(
        id: id, type: .folder, parent: id, name: sealedName(""), owner: u.id, wrappedKey: [],
        access: [AccessEntry(account: u.id, mode: .owner, sealedKey: randomBytes(80))],
        sealedAttributes: randomBytes(20), lastModifiedBy: u.id)
}

func record(
    _ u: TestUser, _ type: FileType, in parent: FileID, named name: String, id: FileID = newFileID(),
    digest: [UInt8]? = nil
) -> FileMetadata {
    FileMetadata(
        id: id, type: type, parent: parent, name: sealedName(name), owner: u.id, wrappedKey: randomBytes(72),
        sealedAttributes: randomBytes(20), contentDigest: digest, lastModifiedBy: u.id)
}

func tempDirectory() -> URL {
    let url = FileManager.default.temporaryDirectory.appendingPathComponent(
        "coffer-server-tests-\(UUID().uuidString)", isDirectory: true)
    try? FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    return url
}

/// A server on the embedded defaults in a fresh directory, plus the directory.
func makeServer(
    quota: Int64 = CofferServer.defaultQuotaBytes,
    clock: @escaping @Sendable () -> Int64 = { Int64(Date().timeIntervalSince1970 * 1000) }
) throws -> (CofferServer, URL) {
    let dir = tempDirectory()
    return (
        try CofferServer.open(
            directory: dir, quotaBytes: quota, clock: clock), dir
    )
}

/// Calls the server as `u`, tracking what it last saw of each file for preconditions.
final class Device: @unchecked Sendable {
    let server: CofferServer
    let user: TestUser
    var seen: [FileID: FileMetadata] = [:]
    /// The signed bytes last accepted for each file, and their revision: an unchanged record is
    /// sent again byte for byte, a changed one one revision up, as a device does.
    var sent: [FileID: (bytes: Data, revision: UInt64)] = [:]

    init(_ server: CofferServer, _ user: TestUser, register: Bool = true) throws {
        self.server = server
        self.user = user
        if register { _ = try server.createAccount(caller: user.key, user.createRequest) }
    }

    func signed(_ m: FileMetadata) -> (bytes: Data, revision: UInt64) {
        if let last = sent[m.id], seen[m.id] == m { return last }
        let revision = (sent[m.id]?.revision ?? 0) + 1
        return (user.sign(m, revision: revision), revision)
    }

    func update(for m: FileMetadata) -> FileUpdate {
        let prev = seen[m.id]
        return FileUpdate(
            record: signed(m).bytes, expectedParent: prev.map { Data($0.parent.bytes) },
            expectedNameMAC: prev.map { Data($0.name.mac) }, expectedRevision: sent[m.id]?.revision)
    }

    @discardableResult
    func push(_ records: [FileMetadata]) throws -> Int64 {
        let signed = records.map(signed)
        let v = try server.upsert(caller: user.key, UpsertRequest(updates: records.map(update(for:)))).version
        for (m, s) in zip(records, signed) {
            seen[m.id] = m
            sent[m.id] = s
        }
        return v
    }

    /// Stores content for `file` (chunks then manifest) and returns its digest.
    func putContent(_ file: FileID, chunks: [[UInt8]]) throws -> [UInt8] {
        var ids: [Data] = []
        for c in chunks {
            let id = Data(blake2b(c))
            try server.putChunk(caller: user.key, id: id, bytes: c)
            ids.append(id)
        }
        let sealed = randomBytes(64)
        let digest = blake2b(sealed)
        try server.putManifest(
            caller: user.key,
            PutManifestRequest(fileID: Data(file.bytes), digest: Data(digest), sealed: Data(sealed), chunkIDs: ids))
        return digest
    }

    func all() throws -> [ServerFile] { try server.updates(caller: user.key, since: 0).files }
}

/// Expects `body` to fail with this status (and code, when given).
func expectRefusal(
    _ status: Int, _ code: String? = nil, sourceLocation: SourceLocation = #_sourceLocation, _ body: () throws -> Void
) {
    do {
        try body()
        Issue.record("expected \(status) \(code ?? ""), but it succeeded", sourceLocation: sourceLocation)
    } catch let e as ServerError {
        #expect(e.status == status, "\(e)", sourceLocation: sourceLocation)
        if let code { #expect(e.code == code, "\(e)", sourceLocation: sourceLocation) }
    } catch {
        Issue.record("unexpected error \(error)", sourceLocation: sourceLocation)
    }
}

func decodeRecord(_ f: ServerFile) throws -> FileMetadata { try SignedMetadata(decoding: Array(f.record)).metadata }
