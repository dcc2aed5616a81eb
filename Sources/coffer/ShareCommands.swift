import ArgumentParser
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
        @Argument(help: "The account to remove.") var username: String

        func run() throws {
            try guarded {
                let vault = try store.openVault()
                let node = try vault.resolve(path)
                guard let contact = try vault.contact(named: username) else {
                    throw CLIError("no pinned account \(username) (see `coffer share list`)")
                }
                try vault.unshare(node.id, from: try AccountID(bytes: contact.signingKey), name: contact.username)
                print("\(vault.path(of: node.id)) is no longer shared with \(contact.username)")
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
                func who(_ e: AccessEntry) -> String { names[e.account.bytes] ?? "key \(e.account)" }
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
