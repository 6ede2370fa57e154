from tp4.cli import main

main()
