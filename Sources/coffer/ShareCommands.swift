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
        subcommands: [AddShare.self, RemoveShare.self, ListShares.self])

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
                try vault.unshare(node.id, from: grantee, name: name)
                print("\(vault.path(of: node.id)) is no longer shared with \(name)")
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
                }
            }
        }
    }
}
