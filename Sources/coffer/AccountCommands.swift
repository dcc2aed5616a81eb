import ArgumentParser
import CofferCrypto
import CofferVault
import Foundation

struct Init: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Create a new account and an empty encrypted tree.")
    @OptionGroup var store: StoreOptions
    @Argument(help: "Your username (letters, digits, '-', '_', '.').") var username: String

    func run() throws {
        try guarded {
            let vault = try Vault.create(dataDirectory: store.resolvedDataDir, username: username)
            print("Created account \(vault.username) in \(vault.dataDirectory).")
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
        @Option(help: "Username for the restored tree.") var username: String = "coffer"

        func run() throws {
            try guarded {
                let input = String(decoding: FileHandle.standardInput.readDataToEndOfFile(), as: UTF8.self)
                let secret = try AccountSecret(exported: input)
                let vault = try Vault.create(dataDirectory: store.resolvedDataDir, username: username, secret: secret)
                print("Imported account \(vault.username) (\(vault.accountID)) into \(vault.dataDirectory).")
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
