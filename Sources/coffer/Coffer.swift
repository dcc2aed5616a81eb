import ArgumentParser
import CofferSync
import CofferVault
import Foundation

@main
struct Coffer: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "coffer",
        abstract: "An end-to-end encrypted, local-first file tree.",
        discussion: """
            Coffer keeps your files encrypted on this device. The store lives in --data-dir, \
            $COFFER_DATA_DIR, or $XDG_DATA_HOME/coffer (default ~/.local/share/coffer).
            """,
        subcommands: [
            Init.self, Account.self, Whoami.self, List.self, Tree.self, Cat.self, Write.self, Edit.self,
            MakeFolder.self, Move.self, Remove.self, Import.self, Export.self, Status.self, Fsck.self,
            GarbageCollect.self, Sync.self, Contacts.self, Share.self, Mount.self, Unmount.self, Pin.self, Unpin.self,
            OnDemand.self, Completions.self,
        ]
    )
}

/// Options every command that touches the store takes.
struct StoreOptions: ParsableArguments {
    @Option(
        name: .customLong("data-dir"),
        help: "Directory of the store (default: $COFFER_DATA_DIR, else $XDG_DATA_HOME/coffer).")
    var dataDir: String?

    var resolvedDataDir: String {
        if let dataDir, !dataDir.isEmpty { return absolute(dataDir) }
        let env = ProcessInfo.processInfo.environment
        if let d = env["COFFER_DATA_DIR"], !d.isEmpty { return absolute(d) }
        if let x = env["XDG_DATA_HOME"], !x.isEmpty { return absolute(x) + "/coffer" }
        let home = env["HOME"] ?? NSHomeDirectory()
        return home + "/.local/share/coffer"
    }

    /// Opens the store's vault, asking for the account key's passphrase (once) if it has one.
    /// The store's vault; one that keeps content on demand fetches what a command reads from
    /// its server.
    func openVault() throws -> Vault {
        let vault = try Vault.open(dataDirectory: resolvedDataDir, passphrase: CLIPassphraseSource())
        if vault.serverSettings != nil, let engine = try? SyncEngine.forStore(vault) {
            vault.setRemoteContent(engine.contentSource)
        }
        return vault
    }
}

func absolute(_ path: String) -> String {
    if path.hasPrefix("/") { return path }
    return FileManager.default.currentDirectoryPath + "/" + path
}

/// One clear line on stderr and exit status 1, for every failure a user can cause.
struct CLIError: Error, CustomStringConvertible {
    let message: String
    init(_ message: String) { self.message = message }
    var description: String { message }
}

/// Runs a command body, turning any error into "coffer: message" and exit code 1, never a trap
/// or a stack of library error text.
func guarded(_ body: () throws -> Void) throws {
    do {
        try body()
    } catch let e as ExitCode {
        throw e
    } catch let e as CleanExit {
        throw e
    } catch {
        let message: String
        switch error {
        case let e as VaultError: message = e.description
        case let e as CLIError: message = e.message
        case let e as CustomStringConvertible: message = e.description
        default: message = "\(error)"
        }
        // One line with no control character: error text may carry a server's words or a file's name.
        FileHandle.standardError.write(Data(("coffer: " + ServerText.sanitized(message, limit: 2000) + "\n").utf8))
        throw ExitCode(1)
    }
}

func printErr(_ s: String) {
    FileHandle.standardError.write(Data((s + "\n").utf8))
}
