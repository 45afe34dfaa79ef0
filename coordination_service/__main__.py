from coordination_service.process import main

if __name__ == "__main__":
    main()
