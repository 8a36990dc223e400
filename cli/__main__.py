from euler.cli.main import main

main()
