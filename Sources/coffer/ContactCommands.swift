import ArgumentParser
import CofferCrypto
import CofferSync
import CofferVault
import Foundation

/// `coffer contacts`: the accounts whose keys this device has pinned (docs/SHARING.md, "Accounts,
/// keys and contacts"). A key is pinned the first time it is fetched; a server that later offers
/// another key for the name is refused, and comparing fingerprints out of band turns trust on
/// first use into a checked key.
struct Contacts: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Accounts whose keys this device has pinned, for sharing.",
        subcommands: [ListContacts.self, AddContact.self, VerifyContact.self, ForgetContact.self],
        defaultSubcommand: ListContacts.self)

    struct ListContacts: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "list", abstract: "List pinned accounts: username, fingerprint, whether verified.")
        @OptionGroup var store: StoreOptions

        func run() throws {
            try guarded {
                let vault = try store.openVault()
                for c in try vault.contacts() {
                    print("\(c.username)\t\(c.fingerprint)\t\(c.verified ? "verified" : "unverified")")
                }
            }
        }
    }

    struct AddContact: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "add", abstract: "Fetch an account's keys from the server and pin them.")
        @OptionGroup var store: StoreOptions
        @Argument(help: "The account's username.") var username: String

        func run() throws {
            try guarded {
                let vault = try store.openVault()
                let engine = try SyncEngine.forStore(vault)
                let (contact, fresh) = try runBlocking { [username] in try await engine.contact(username) }
                if fresh {
                    print("pinned \(contact.username): \(contact.fingerprint)")
                    print(
                        "compare this fingerprint with \(contact.username) (they see it with `coffer whoami`), "
                            + "then run `coffer contacts verify \(contact.username) FINGERPRINT`")
                } else {
                    let state = contact.verified ? "verified" : "unverified"
                    print("\(contact.username): \(contact.fingerprint) (already pinned, \(state))")
                }
            }
        }
    }

    struct VerifyContact: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "verify", abstract: "Mark a pinned account verified, if the fingerprint matches.")
        @OptionGroup var store: StoreOptions
        @Argument(help: "The account's username.") var username: String
        @Argument(parsing: .remaining, help: "The fingerprint they read to you (spaces allowed).")
        var fingerprint: [String]

        func run() throws {
            try guarded {
                let vault = try store.openVault()
                guard var contact = try vault.contact(named: username) else {
                    throw CLIError("no pinned account \(username); run `coffer contacts add \(username)` first")
                }
                let typed = KeyFingerprint.normalized(fingerprint.joined())
                guard !typed.isEmpty else { throw CLIError("give the fingerprint to compare") }
                guard typed == KeyFingerprint.normalized(contact.fingerprint) else {
                    throw CLIError(
                        "that fingerprint does not match the key pinned for \(contact.username) "
                            + "(\(contact.fingerprint)); nothing was changed")
                }
                contact.verified = true
                try vault.pin(contact)
                print("\(contact.username) verified")
            }
        }
    }

    struct ForgetContact: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "forget", abstract: "Unpin an account (its next key is pinned afresh).")
        @OptionGroup var store: StoreOptions
        @Argument(help: "The account's username.") var username: String

        func run() throws {
            try guarded {
                let vault = try store.openVault()
                guard try vault.forgetContact(named: username) else { throw CLIError("no pinned account \(username)") }
                print("forgot \(username)")
            }
        }
    }
}
