import ArgumentParser
import CofferCrypto
import CofferModel
import CofferSync
import CofferVault
import Foundation

/// `coffer share`: the owner's side of sharing (docs/SHARING.md). Grants are made and revoked in
/// this device's store and reach the server at the next sync, like any other change.
struct Share: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Share folders and files with other accounts.",
        subcommands: [
            AddShare.self, RemoveShare.self, ListShares.self, PendingShares.self, AcceptShare.self, RejectShare.self,
        ])

    struct AddShare: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "add", abstract: "Share PATH with USER, read-only unless --write (or change the mode).")
        @OptionGroup var store: StoreOptions
        @Argument(help: "The folder or file to share.") var path: String
        @Argument(help: "The account to share it with.") var username: String
        @Flag(help: "Let USER change it too.") var write = false

        func run() throws {
            try guarded {
                let vault = try store.openVault()
                let node = try vault.resolve(path)
                let engine = try SyncEngine.forStore(vault)
                let (contact, fresh) = try runBlocking { [username] in try await engine.contact(username) }
                if fresh {
                    print("pinned \(contact.username): \(contact.fingerprint) (compare it with them)")
                } else if !contact.verified {
                    print("\(contact.username): \(contact.fingerprint) (pinned, not yet verified)")
                }
                try vault.share(node.id, with: contact, mode: write ? .write : .read)
                print(
                    "shared \(vault.path(of: node.id)) with \(contact.username) (\(write ? "read-write" : "read-only"))"
                )
            }
        }
    }

    struct RemoveShare: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "remove", abstract: "Stop sharing PATH with USER.")
        @OptionGroup var store: StoreOptions
        @Argument(help: "The shared folder or file.") var path: String
        @Argument(help: "The account to remove: a username, or the key fingerprint `coffer share list` shows.")
        var account: String

        func run() throws {
            try guarded {
                let vault = try store.openVault()
                let node = try vault.resolve(path)
                // The grantee is found among the file's own grants: by the key pinned for the
                // name, else by a fingerprint (a grant whose key this device never pinned).
                let grantees = try vault.grants(reaching: node.id).filter { $0.file == node.id }.map(\.grant.account)
                let pinned = try? vault.contact(named: account)
                let typed = KeyFingerprint.normalized(account)
                guard
                    let grantee = grantees.first(where: { $0.bytes == pinned?.signingKey })
                        ?? grantees.first(where: {
                            !typed.isEmpty && KeyFingerprint.normalized(KeyFingerprint.of($0.bytes)) == typed
                        })
                else {
                    throw CLIError("\(vault.path(of: node.id)) is not shared with \(account) (see `coffer share list`)")
                }
                let name = pinned?.username ?? account
                // Everyone who keeps access gets the new keys (docs/SHARING.md, "Revocation").
                let keeping = try vault.granteesKeeping(node.id, without: grantee)
                let boxKeys = try runBlocking { () async throws -> [AccountID: PublicBoxKey] in
                    if keeping.isEmpty { return [:] }
                    return try await SyncEngine.forStore(vault).boxKeys(for: keeping)
                }
                try vault.unshare(node.id, from: grantee, name: name, boxKeys: boxKeys)
                print("\(vault.path(of: node.id)) is no longer shared with \(name); its keys were replaced")
            }
        }
    }

    struct ListShares: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "list",
            abstract: "Who has access: to PATH (through it or a folder above), or to every shared file.")
        @OptionGroup var store: StoreOptions
        @Argument(help: "A folder or file (default: every file you share).") var path: String?

        func run() throws {
            try guarded {
                let vault = try store.openVault()
                let names = Dictionary(
                    try vault.contacts().map { (Array($0.signingKey), $0.username) }, uniquingKeysWith: { a, _ in a })
                func who(_ e: AccessEntry) -> String {
                    names[e.account.bytes] ?? "key " + KeyFingerprint.normalized(KeyFingerprint.of(e.account.bytes))
                }
                func line(_ file: FileID, _ e: AccessEntry) -> String {
                    let mode = e.mode == .write ? "read-write" : "read-only"
                    return "\(vault.path(of: file))\t\(who(e))\t\(mode)\(e.isDeleted ? "\trevoked" : "")"
                }
                if let path {
                    for (file, e) in try vault.grants(reaching: try vault.resolve(path).id) { print(line(file, e)) }
                } else {
                    let shared = try vault.sharedFiles().map { (vault.path(of: $0.file), $0) }.sorted { $0.0 < $1.0 }
                    for (_, s) in shared { for e in s.grants { print(line(s.file, e)) } }
                    // The other direction: what other accounts share with this one.
                    for s in try vault.incomingShares() {
                        let mode = s.mode == .write ? "read-write" : "read-only"
                        let place = s.link.map { "at " + vault.path(of: $0) } ?? "pending \(s.id)"
                        print("\(s.name ?? "?")\tfrom \(ownerName(s.owner, vault))\t\(mode)\t\(place)")
                    }
                }
            }
        }
    }

    struct PendingShares: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "pending",
            abstract: "Shares other accounts made with you that you have not accepted, one per line, ID first.")
        @OptionGroup var store: StoreOptions
        @Flag(help: "One JSON array of objects (id, owner, ownerKey, ownerPinned, name, type, mode, size).")
        var json = false

        func run() throws {
            try guarded {
                let vault = try store.openVault()
                let pending = try vault.incomingShares().filter { $0.link == nil }
                if json {
                    let pinned = Set(try vault.contacts().map(\.signingKey))
                    let items = pending.map {
                        PendingJSON(
                            id: $0.id.description, owner: ownerName($0.owner, vault),
                            ownerKey: KeyFingerprint.normalized(KeyFingerprint.of($0.owner.bytes)),
                            ownerPinned: pinned.contains($0.owner.bytes), name: $0.name,
                            type: typeName($0.type), mode: $0.mode == .write ? "write" : "read", size: $0.size)
                    }
                    let encoder = JSONEncoder()
                    encoder.outputFormatting = [.sortedKeys]
                    print(String(decoding: try encoder.encode(items), as: UTF8.self))
                    return
                }
                for s in pending {
                    let mode = s.mode == .write ? "read-write" : "read-only"
                    let fields = [
                        "\(s.id)", ownerName(s.owner, vault), mode, typeName(s.type), "\(s.size)", s.name ?? "?",
                    ]
                    print(fields.joined(separator: "\t"))
                }
            }
        }
    }

    struct PendingJSON: Encodable {
        var id: String
        var owner: String
        var ownerKey: String
        var ownerPinned: Bool
        var name: String?
        var type: String
        var mode: String
        var size: UInt64
    }

    struct AcceptShare: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "accept", abstract: "Place the share ID in your tree, in the folder DEST.")
        @OptionGroup var store: StoreOptions
        @Argument(help: "The share's id, as `coffer share pending` shows it.") var id: String
        @Argument(help: "The folder of your tree to place it in.") var dest: String
        @Option(help: "The name to give it (default: its owner's name for it).") var name: String?

        func run() throws {
            try guarded {
                let vault = try store.openVault()
                let share = try parseShareID(id)
                let folder = try vault.resolve(dest)
                guard folder.type == .folder else { throw VaultError.tree(.notAFolder(dest)) }
                let link = try vault.acceptShare(share, in: folder.id, name: name)
                print("accepted: \(vault.path(of: link.id))")
            }
        }
    }

    struct RejectShare: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "reject",
            abstract: "Give up the share ID (pending or accepted): your access ends, and its owner sees it.")
        @OptionGroup var store: StoreOptions
        @Argument(help: "The share's id, as `coffer share pending` or `coffer share list` shows it.") var id: String

        func run() throws {
            try guarded {
                let vault = try store.openVault()
                let share = try parseShareID(id)
                let engine = try SyncEngine.forStore(vault)
                try runBlocking { try await engine.rejectShare(share) }
                print("rejected share \(share)")
            }
        }
    }
}

/// A share id as `coffer share pending` prints it (a UUID; dashes optional).
func parseShareID(_ text: String) throws -> FileID {
    guard let id = FileID(uuidString: text) else {
        throw CLIError("\(text) is not a share id (see `coffer share pending`)")
    }
    return id
}

/// An account as the user knows it: the pinned contact's name; else its key's fingerprint, after
/// the name the account gives itself if the server told it ("alice? key …": not pinned, so not
/// vouched for; `coffer contacts add` pins it).
func ownerName(_ account: AccountID, _ vault: Vault) -> String {
    if let c = (try? vault.contacts())?.first(where: { $0.signingKey == account.bytes }) { return c.username }
    let key = "key " + KeyFingerprint.normalized(KeyFingerprint.of(account.bytes))
    return vault.claimedName(of: account).map { "\($0)? \(key)" } ?? key
}

func typeName(_ type: FileType) -> String {
    switch type {
    case .folder: "folder"
    case .document: "document"
    case .symlink: "symlink"
    case .link: "link"
    }
}
