import CofferCrypto
import CofferModel
import CofferProtocol
import CofferServerCore
import CofferTestSupport
import Foundation
import Testing

/// Randomized trials of the server's sharing rules and feeds: three accounts create, rename,
/// move, delete, share, change modes and revoke at random, each change sent as a client that
/// skips its own checks would send it. An oracle (the model's `accessMode` over the records the
/// server accepted) predicts every answer: a change is accepted exactly when the writer holds
/// the access it needs, and after every step each account's pulled view (its own records plus
/// its feed, `gone` ids dropped with what lies below them) is exactly what it may see now, as is
/// a pull from scratch.
@Suite("Randomized sharing trials at the server")
struct SharingTrialTests {
    final class World {
        let server: CofferServer
        let users: [TestUser]
        var records: [FileID: FileMetadata] = [:]
        var revisions: [FileID: UInt64] = [:]
        var roots: [FileID] = []
        var views: [[FileID: FileMetadata]]
        var cursors: [(Int64, Data?)]
        var rng: SplitMix
        var accepted = 0
        var refused = 0

        init(seed: UInt64) throws {
            (server, _) = try makeServer()
            users = [TestUser("ann"), TestUser("ben"), TestUser("cat")]
            views = Array(repeating: [:], count: users.count)
            cursors = Array(repeating: (0, nil), count: users.count)
            rng = SplitMix(seed: seed)
            for u in users {
                _ = try server.createAccount(caller: u.key, u.createRequest)
                let root = rootRecord(u)
                try push(u, [root])
                roots.append(root.id)
            }
        }

        func tree(of owner: AccountID) -> FileTree { FileTree(records.values.filter { $0.owner == owner }) }

        /// Sends records as `writer` with the preconditions of what the server holds.
        func push(_ writer: TestUser, _ batch: [FileMetadata]) throws {
            let updates = batch.map { m -> FileUpdate in
                let old = records[m.id]
                let revision = (revisions[m.id] ?? 0) + 1
                return FileUpdate(
                    record: writer.sign(m, revision: revision), expectedParent: old.map { Data($0.parent.bytes) },
                    expectedNameMAC: old.map { Data($0.name.mac) }, expectedRevision: revisions[m.id])
            }
            _ = try server.upsert(caller: writer.key, UpsertRequest(updates: updates))
            for m in batch {
                records[m.id] = m
                revisions[m.id, default: 0] += 1
            }
        }

        func pick<T>(_ items: [T]) -> T? {
            items.isEmpty ? nil : items[Int(rng.next() % UInt64(items.count))]
        }

        /// One random change by a random account, predicted by the oracle and checked against
        /// the server's answer.
        func step() throws {
            let actor = users[Int(rng.next() % 3)]
            let liveFolders = records.values.filter {
                $0.type == .folder && !$0.isDeleted && tree(of: $0.owner).isLive($0.id)
            }
            guard let folder = pick(liveFolders) else { return }
            let ownerTree = tree(of: folder.owner)
            let mode = ownerTree.accessMode(of: actor.id, on: folder.id)
            let mayWrite = (mode ?? .read) >= .write
            var change: FileMetadata
            let kind = rng.next() % 6
            switch kind {
            case 0, 1:  // create a folder or a document, owned by the folder's owner
                let type: FileType = kind == 0 ? .folder : .document
                change = record(
                    users.first { $0.id == folder.owner }!, type, in: folder.id, named: "n\(rng.next() % 1000)")
                change.contentDigest = nil
            case 2:  // rename or move something below a folder of the same owner
                let candidates = records.values.filter {
                    $0.owner == folder.owner && !$0.isRoot && !$0.isDeleted && ownerTree.isLive($0.id)
                        && !ownerTree.ancestors(of: folder.id).contains($0.id) && $0.id != folder.id
                }
                guard let m = pick(candidates) else { return }
                change = m
                change.parent = folder.id
                change.name = sealedName("m\(rng.next() % 1000)")
                let mayMove =
                    mayWrite && (ownerTree.accessMode(of: actor.id, on: m.parent) ?? .read) >= .write
                try expect(change, by: actor, accepted: mayMove)
                return
            case 3:  // delete the folder
                guard !folder.isRoot else { return }
                change = folder
                change.isDeleted = true
                let mayDelete = (ownerTree.accessMode(of: actor.id, on: folder.parent) ?? .read) >= .write
                try expect(change, by: actor, accepted: mayDelete)
                return
            default:  // grant, change a mode or revoke on the folder: only its owner may
                guard !folder.isRoot, let other = pick(users.filter { $0.id != folder.owner }) else { return }
                let owner = users.first { $0.id == folder.owner }!
                change = folder
                let current = folder.access.first { $0.account == other.id }
                let revoke = current.map { !$0.isDeleted } ?? false
                let entry = try signedGrant(
                    folder.id, owner: owner, to: other, revoke ? current!.mode : (rng.next() % 2 == 0 ? .read : .write),
                    deleted: revoke)
                if let i = change.access.firstIndex(where: { $0.account == other.id }) {
                    change.access[i] = entry
                } else {
                    change.access.append(entry)
                }
                try expect(change, by: actor, accepted: actor.id == owner.id)  // no links in these trials
                return
            }
            try expect(change, by: actor, accepted: mayWrite)
        }

        func expect(_ m: FileMetadata, by actor: TestUser, accepted: Bool) throws {
            var m = m
            m.lastModifiedBy = actor.id
            let before = records
            do {
                try push(actor, [m])
                #expect(accepted, "the server accepted a change the rules refuse: \(m.id) by \(actor.username)")
                self.accepted += 1
            } catch let e as ServerError {
                #expect(!accepted || e.status == 409, "refused \(m.id) by \(actor.username): \(e)")
                #expect(records == before)
                refused += 1
            }
        }

        /// What `account` may see now: its own files, and every file it holds a mode on.
        func oracle(_ i: Int) -> [FileID: FileMetadata] {
            let me = users[i].id
            var out: [FileID: FileMetadata] = [:]
            for owner in users.map(\.id) {
                let t = tree(of: owner)
                for m in t.files.values where owner == me || t.accessMode(of: me, on: m.id) != nil { out[m.id] = m }
            }
            return out
        }

        /// Whether a file is live in its owner's tree (not deleted, itself or above).
        func isLive(_ id: FileID) -> Bool {
            guard let m = records[id] else { return false }
            return tree(of: m.owner).isLive(id)
        }

        /// Compares a view with the oracle: the same live files, and nothing it may not see. A
        /// deleted file may be missing (a share sends a folder's live subtree only) or kept.
        func expectExact(_ view: [FileID: FileMetadata], _ i: Int, _ what: String) {
            let expected = oracle(i)
            let liveSeen = Set(view.keys.filter(isLive))
            let liveExpected = Set(expected.keys.filter(isLive))
            #expect(liveSeen == liveExpected, "\(what): \(users[i].username) sees the wrong live files")
            for (id, m) in view {
                #expect(expected[id] != nil, "\(what): \(users[i].username) holds \(id), which it may not see")
                if let e = expected[id] { #expect(e == m, "\(what): stale record \(id) for \(users[i].username)") }
            }
        }

        /// Pulls everything after `cursor` for account `i`, applied to `view`.
        func pull(
            _ i: Int, into view: inout [FileID: FileMetadata], from cursor: (Int64, Data?)
        ) throws -> (
            Int64, Data?
        ) {
            var cursor = cursor
            while true {
                let page = try server.updates(caller: users[i].key, since: cursor.0, afterID: cursor.1, shared: true)
                for f in page.files {
                    let m = try decodeRecord(f)
                    view[m.id] = m
                }
                let gone = Set(try (page.gone ?? []).map { try FileID(bytes: Array($0)) })
                if !gone.isEmpty { Self.prune(gone, &view, me: users[i].id) }
                cursor = (page.latest, page.nextAfterID)
                if !page.more { return cursor }
            }
        }

        /// What a device does with `gone` ids (docs/SHARING.md, "The feed"): drops each, and
        /// what lies below it, but for subtrees under a grant of their own to it.
        static func prune(_ gone: Set<FileID>, _ view: inout [FileID: FileMetadata], me: AccountID) {
            let before = view
            for id in before.keys where before[id]?.owner != me {
                var cursor = id
                for _ in 0...TreeLimits.maxDepth + 1 {
                    if gone.contains(cursor) {
                        view[id] = nil
                        break
                    }
                    guard let m = before[cursor], m.grant(to: me) == nil, !m.isRoot else { break }
                    cursor = m.parent
                }
            }
        }

        func checkViews() throws {
            for i in users.indices {
                cursors[i] = try pull(i, into: &views[i], from: cursors[i])
                expectExact(views[i], i, "incremental")
            }
        }
    }

    @Test(arguments: [1, 2, 3, 4] as [UInt64])
    func randomSharingKeepsEveryViewExact(seed: UInt64) throws {
        let w = try World(seed: seed)
        for n in 0..<320 {
            try w.step()
            if n % 8 == 7 { try w.checkViews() }
        }
        try w.checkViews()
        // A pull from scratch agrees with the incremental one.
        for i in w.users.indices {
            var fresh: [FileID: FileMetadata] = [:]
            _ = try w.pull(i, into: &fresh, from: (0, nil))
            w.expectExact(fresh, i, "from scratch")
            #expect(try w.server.audit(account: w.users[i].key).isEmpty)
        }
        #expect(w.accepted > 40 && w.refused > 10, "accepted \(w.accepted), refused \(w.refused)")
    }
}
