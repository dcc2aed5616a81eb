import ArgumentParser
import CofferCrypto
import CofferSync
import CofferVault
import Foundation

struct Init: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Create a new account and an empty encrypted tree.")
    @OptionGroup var store: StoreOptions
    @Argument(help: "Your username (letters, digits, '-', '_', '.').") var username: String
    @Option(help: "Register the account with this coffer-server (e.g. http://127.0.0.1:8080) and sync with it.") var server: String?
    @Option(help: "An invite code from the server's operator (for a server that registers by invite).") var invite: String?

    func run() throws {
        try guarded {
            let dir = store.resolvedDataDir
            let vault = try Vault.create(dataDirectory: dir, username: username)
            if let server {
                do {
                    try vault.setServer(server)
                    let engine = SyncEngine(vault: vault, transport: HTTPTransport(baseURL: server))
                    try runBlocking { [invite] in try await engine.register(invite: invite) }
                    try runBlocking { try await engine.sync() }
                } catch {
                    // Nothing half-applied: without the server account, the local one is removed too.
                    removeNewStore(dir)
                    throw error
                }
            }
            print("Created account \(vault.username) in \(vault.dataDirectory)\(server.map { " (synced with \($0))" } ?? "").")
            print("Back up your key now: `coffer account export --phrase` prints your 24-word recovery phrase.")
        }
    }
}

struct Account: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Export or import the account key.",
                                                    subcommands: [ExportKey.self, ImportKey.self])

    struct ExportKey: ParsableCommand {
        static let configuration = CommandConfiguration(commandName: "export", abstract: "Print the account key (base64, or the 24-word phrase).")
        @OptionGroup var store: StoreOptions
        @Flag(help: "Print the 24-word recovery phrase instead of the base64 string.") var phrase = false

        func run() throws {
            try guarded {
                let vault = try store.openVault()
                let secret = vault.exportedSecret
                print(phrase ? secret.phrase.joined(separator: " ") : secret.base64)
            }
        }
    }

    struct ImportKey: ParsableCommand {
        static let configuration = CommandConfiguration(commandName: "import", abstract: "Restore an account from a phrase or base64 key read on stdin.")
        @OptionGroup var store: StoreOptions
        @Option(help: "Username for the restored tree (without --server).") var username: String = "coffer"
        @Option(help: "Join the account on this server and bring the whole tree down.") var server: String?

        func run() throws {
            try guarded {
                let input = String(decoding: FileHandle.standardInput.readDataToEndOfFile(), as: UTF8.self)
                let secret = try AccountSecret(exported: input)
                let dir = store.resolvedDataDir
                guard let server else {
                    let vault = try Vault.create(dataDirectory: dir, username: username, secret: secret)
                    print("Imported account \(vault.username) (\(vault.accountID)) into \(vault.dataDirectory).")
                    return
                }
                // The tree arrives with the first pull; the username is the server's.
                let probe = SyncEngine(vault: try Vault.create(dataDirectory: dir, username: username, secret: secret, createRoot: false),
                                       transport: HTTPTransport(baseURL: server))
                do {
                    try probe.vault.setServer(server)
                    let report = try runBlocking { try await probe.sync() }
                    guard probe.vault.hasRoot else { throw CLIError("the server has no tree for this account; create it with `coffer init NAME --server URL`") }
                    print("Joined account \(probe.vault.username) (\(probe.vault.accountID)) from \(server): \(report.pulled) files.")
                } catch {
                    removeNewStore(dir)
                    throw error
                }
            }
        }
    }
}

struct Whoami: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Show the account of this store.")
    @OptionGroup var store: StoreOptions

    func run() throws {
        try guarded {
            let vault = try store.openVault()
            print("\(vault.username) (key \(vault.accountID))")
        }
    }
}

struct Completions: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Print a shell completion script (bash, zsh or fish).")
    @Argument(help: "bash, zsh or fish") var shell: String

    func run() throws {
        try guarded {
            guard let kind = CompletionShell(rawValue: shell) else { throw CLIError("unknown shell \"\(shell)\"; use bash, zsh or fish") }
            print(Coffer.completionScript(for: kind))
        }
    }
}

/// Removes a store this command just created (its secret first, so a half-removed store is not
/// mistaken for an account).
func removeNewStore(_ dir: String) {
    for name in ["account.secret", "coffer.sqlite", "coffer.sqlite-wal", "coffer.sqlite-shm", "content.lock", "mount.lock"] {
        unlink(dir + "/" + name)
    }
    rmdir(dir)
}

struct Sync: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Sync with the server: pull, push, merge.")
    @OptionGroup var store: StoreOptions
    @Flag(help: "Also print the bytes and requests exchanged with the server.") var stats = false

    func run() throws {
        try guarded {
            let vault = try store.openVault()
            let engine = try SyncEngine.forStore(vault)
            let report = try runBlocking { try await engine.sync() }
            print("synced: pulled \(report.pulled) records (\(report.fetchedChunks) chunks), pushed \(report.pushedRecords) records (\(report.pushedChunks) chunks)")
            if stats {
                let t = engine.traffic
                print("traffic: \(t.requests) requests, \(t.sent) bytes sent, \(t.received) bytes received")
            }
        }
    }
}
