import CofferCrypto
import CofferModel
import CofferProtocol
import Foundation

extension CofferServer {
    /// Audits every account; returns problems prefixed with the account's key.
    public func auditAll() throws(ServerError) -> [String] {
        let keys = try guarded { try metadata.read { try $0.accountKeys() } }
        var problems: [String] = []
        for k in keys {
            let prefix = RequestSigning.hex(Array(k.prefix(8)))
            problems += try audit(account: k).map { "account \(prefix): \($0)" }
        }
        return problems
    }

    /// The server's own check of one account, read afresh from storage (not the cache): every
    /// record decodes, is owned and signed by the account, the effective tree satisfies every
    /// invariant (`Validator.validateAll`), every file under a deleted folder is marked deleted,
    /// every live document's content has its manifest, every chunk a manifest lists is in the
    /// content store, and the account's usage is what its stored records, manifests and chunks
    /// count (`QuotaRule`). Returns the problems found (empty when clean).
    public func audit(account: Data) throws(ServerError) -> [String] {
        try guarded {
            var problems: [String] = []
            guard let accountID = try? AccountID(bytes: Array(account)),
                let key = try? PublicSigningKey(bytes: Array(account))
            else {
                return ["malformed account key"]
            }
            let files = try metadata.read { try $0.files(account: account, since: 0) }
            var tree = FileTree()
            var byID: [FileID: StoredFile] = [:]
            for f in files {
                guard let s = try? SignedMetadata(decoding: Array(f.record)) else {
                    problems.append("undecodable record")
                    continue
                }
                var m = s.metadata
                if m.owner != accountID { problems.append("file \(m.id) not owned by the account") }
                if !key.verify(signature: s.signature, message: s.message) {
                    problems.append("bad signature on file \(m.id)")
                }
                if f.deleted != (m.isDeleted || f.serverDeleted) {
                    problems.append("file \(m.id): deleted flag inconsistent")
                }
                if f.deleted { m.isDeleted = true }
                tree.insert(m)
                byID[m.id] = f
            }
            do { try Validator.validateAll(tree) } catch { problems.append("invariant: \(error)") }
            for (id, m) in tree.files {
                if !m.isDeleted, tree.deletionState(of: id) == .implicitlyDeleted {
                    problems.append("file \(id) is under a deleted folder but not marked deleted")
                }
                if m.type == .document, !m.isDeleted, let d = m.contentDigest {
                    let k = ManifestKey(account: account, fileID: Data(id.bytes), digest: Data(d))
                    if try !metadata.read({ try $0.hasManifest(k) }) {
                        problems.append("document \(id) has no manifest for its content")
                    }
                }
            }
            let (stored, recounted) = try metadata.read { tx in
                (try tx.account(key: account)?.bytesUsed, try tx.recountedUsage(account: account))
            }
            if let stored, stored != recounted {
                problems.append("usage is \(stored) bytes but what is stored counts \(recounted)")
            }
            let known = try metadata.read { try $0.allChunkKeys() }
            for k in known where k.account == account {
                if try !content.has(k) {
                    problems.append("chunk \(RequestSigning.hex(Array(k.id))) recorded but not stored")
                }
            }
            return problems
        }
    }
}
